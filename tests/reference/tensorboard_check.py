"""TensorBoard reads what `shardtrain train` writes: a short one-process run on synthetic data logs every step, then
TensorBoard's own event reader (tensorboard.backend.event_processing) loads the event file and must find the
training scalars at every logged step with the values the run's metrics.csv holds (written with 6 significant
digits, so compared to 1e-5 relative), and the held-out metrics.

    python tests/reference/tensorboard_check.py path/to/shardtrain
"""
import csv
import math
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator


def main():
    shardtrain = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="shardtrain-tb-") as root:
        subprocess.run([shardtrain, "data", "synth", "--out", f"{root}/data", "--image-text", "64", "--text", "32",
                        "--image", "32", "--eval", "16", "--image-size", "32", "--shard-size", "32"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(f"{root}/config.yaml", "w") as f:
            f.write(f"""model: {{flavor: flava-debug}}
data:
  image_text: [{root}/data/image_text]
  text: [{root}/data/text]
  image: [{root}/data/image]
  eval: [{root}/data/eval]
  vocab: {root}/data/vocab.txt
  max_text_length: 16
optim: {{lr: 1.0e-3, warmup_steps: 1}}
train: {{steps: 4, batch_size: 4, eval_interval: 2, eval_samples: 16}}
log: {{interval: 1, progress: lines, peak_tflops: 1, dir: {root}/log}}
launch: {{num_processes: 1}}
""")
        run = subprocess.run([shardtrain, "train", f"{root}/config.yaml"], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"shardtrain train failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
        files = [n for n in os.listdir(f"{root}/log") if n.startswith("events.out.tfevents.")]
        if len(files) != 1:
            sys.exit(f"expected one event file in {root}/log, found {files}")
        acc = event_accumulator.EventAccumulator(f"{root}/log/{files[0]}", size_guidance={"scalars": 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        with open(f"{root}/log/metrics.csv") as f:
            rows = list(csv.DictReader(f))
        failures = []
        for tag, column in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm")]:
            if tag not in tags:
                failures.append(f"tag {tag} missing; the file has {sorted(tags)}")
                continue
            events = {e.step: e.value for e in acc.Scalars(tag)}
            for row in rows:
                step, want = int(row["step"]), float(row[column])
                got = events.get(step)
                if got is None or not math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-12):
                    failures.append(f"{tag} at step {step}: event {got}, csv {want}")
        if [int(r["step"]) for r in rows] != [1, 2, 3, 4]:
            failures.append(f"csv steps {[r['step'] for r in rows]}, expected 1..4")
        for tag in ("eval/itm_accuracy", "eval/r1_image_to_text"):
            if tag not in tags:
                failures.append(f"tag {tag} missing")
            elif sorted(e.step for e in acc.Scalars(tag)) != [0, 2, 4]:
                failures.append(f"{tag} at steps {[e.step for e in acc.Scalars(tag)]}, expected 0, 2, 4")
        if failures:
            sys.exit("TensorBoard does not read what was written:\n  " + "\n  ".join(failures))
        print(f"TensorBoard read {len(tags)} scalar tags; train/loss, lr and grad_norm equal metrics.csv at steps 1-4")


if __name__ == "__main__":
    main()
