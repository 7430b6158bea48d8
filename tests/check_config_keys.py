"""docs/guide/config-keys.md holds what `shardtrain config --default` prints — every key of the config's field
table with its default and, for an enumeration, its values — so that the page cannot drift from the code.

    python tests/check_config_keys.py SHARDTRAIN_BIN          # exit 1, with a diff, when the page is stale
    python tests/check_config_keys.py SHARDTRAIN_BIN --write  # rewrites the page's block
"""
import difflib
import os
import subprocess
import sys

PAGE = os.path.join(os.path.dirname(__file__), "..", "docs", "guide", "config-keys.md")
OPEN, CLOSE = "```yaml\n", "```\n"


def main():
    binary = sys.argv[1]
    printed = subprocess.run([binary, "config", "--default"], check=True, capture_output=True, text=True).stdout
    page = open(PAGE, encoding="utf-8").read()
    start = page.index(OPEN) + len(OPEN)
    end = page.index(CLOSE, start)
    if "--write" in sys.argv[2:]:
        open(PAGE, "w", encoding="utf-8").write(page[:start] + printed + page[end:])
        print(f"wrote {PAGE}")
        return
    if page[start:end] == printed:
        print(f"docs/guide/config-keys.md: {printed.count(chr(10))} lines, as `shardtrain config --default` prints them")
        return
    sys.stdout.writelines(difflib.unified_diff(page[start:end].splitlines(True), printed.splitlines(True),
                                               "docs/guide/config-keys.md", "shardtrain config --default"))
    print("docs/guide/config-keys.md is stale: python tests/check_config_keys.py BIN --write rewrites it")
    sys.exit(1)


if __name__ == "__main__":
    main()
