#include "shardtrain/data/pipeline/synth.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardtrain/data/pipeline/random.h"
#include "data/formats/tar.h"
#include "shardtrain/data/tokenizers/tokenizer.h"
#include "shardtrain/io/files.h"

namespace shardtrain::data {
namespace {

struct Colour {
  const char* name;
  uint8_t r, g, b;
};
constexpr std::array<Colour, 8> kColours = {{{"red", 220, 40, 40},
                                             {"green", 40, 190, 60},
                                             {"blue", 50, 80, 230},
                                             {"yellow", 235, 220, 50},
                                             {"purple", 150, 60, 200},
                                             {"orange", 245, 140, 30},
                                             {"white", 240, 240, 240},
                                             {"cyan", 40, 210, 220}}};
constexpr std::array<const char*, 5> kShapes = {"circle", "square", "triangle", "diamond", "cross"};
constexpr std::array<const char*, 5> kPlaces = {"on the left", "on the right", "at the top", "at the bottom",
                                                "in the middle"};
constexpr std::array<const char*, 3> kCounts = {"a", "two", "three"};
// Caption openings, so the text model sees some variety around the content words.
constexpr std::array<const char*, 5> kOpenings = {"", "a picture of ", "there is ", "an image with ", "we see "};

struct Object {
  int shape, colour, place, count;
  bool large;
};

// Centres of the `count` copies at a place, in [0, 1] coordinates.
std::vector<std::pair<double, double>> centres(int place, int count, bool large, std::mt19937_64& rng) {
  static const double anchor[5][2] = {{0.25, 0.5}, {0.75, 0.5}, {0.5, 0.22}, {0.5, 0.78}, {0.5, 0.5}};
  std::vector<std::pair<double, double>> out;
  const bool horizontal_row = place >= 2;  // top/bottom/middle: copies side by side; left/right: stacked
  for (int i = 0; i < count; ++i) {
    const double offset = (i - (count - 1) / 2.0) * (large ? 0.34 : 0.22);  // copies side by side, not overlapping
    const double jitter_x = (static_cast<double>(rng() % 1000) / 1000.0 - 0.5) * 0.06;
    const double jitter_y = (static_cast<double>(rng() % 1000) / 1000.0 - 0.5) * 0.06;
    double x = anchor[place][0] + (horizontal_row ? offset : 0) + jitter_x;
    double y = anchor[place][1] + (horizontal_row ? 0 : offset) + jitter_y;
    out.emplace_back(x, y);
  }
  return out;
}

bool inside(int shape, double dx, double dy, double r) {  // (dx, dy) from the centre, r = half size
  const double ax = std::fabs(dx), ay = std::fabs(dy);
  switch (shape) {
    case 0: return dx * dx + dy * dy <= r * r;
    case 1: return ax <= r * 0.85 && ay <= r * 0.85;
    case 2: return dy <= r * 0.8 && dy >= -r * 0.9 && ax <= (dy + r * 0.9) * 0.6;  // apex up
    case 3: return ax + ay <= r;
    case 4: return (ax <= r * 0.3 && ay <= r) || (ay <= r * 0.3 && ax <= r);
  }
  return false;
}

void draw(Image& image, const Object& o, double cx, double cy) {
  const double size = static_cast<double>(image.width);
  const double r = (o.large ? 0.16 : 0.09) * size;
  const Colour& c = kColours[static_cast<size_t>(o.colour)];
  const double px = cx * size, py = cy * size;
  const int64_t x0 = std::max<int64_t>(0, static_cast<int64_t>(px - r - 1));
  const int64_t x1 = std::min<int64_t>(image.width - 1, static_cast<int64_t>(px + r + 1));
  const int64_t y0 = std::max<int64_t>(0, static_cast<int64_t>(py - r - 1));
  const int64_t y1 = std::min<int64_t>(image.height - 1, static_cast<int64_t>(py + r + 1));
  for (int64_t y = y0; y <= y1; ++y) {
    for (int64_t x = x0; x <= x1; ++x) {
      // 2x2 supersampling for smooth edges
      int hits = 0;
      for (double sy : {0.25, 0.75}) {
        for (double sx : {0.25, 0.75}) hits += inside(o.shape, x + sx - px, y + sy - py, r);
      }
      if (!hits) continue;
      uint8_t* p = &image.rgb[static_cast<size_t>((y * image.width + x) * 3)];
      const double a = hits / 4.0;
      p[0] = static_cast<uint8_t>(p[0] * (1 - a) + c.r * a);
      p[1] = static_cast<uint8_t>(p[1] * (1 - a) + c.g * a);
      p[2] = static_cast<uint8_t>(p[2] * (1 - a) + c.b * a);
    }
  }
}

std::string describe(const Object& o) {
  std::string s = kCounts[static_cast<size_t>(o.count - 1)];
  s += std::string(" ") + (o.large ? "large" : "small") + " " + kColours[static_cast<size_t>(o.colour)].name + " " +
       kShapes[static_cast<size_t>(o.shape)] + (o.count > 1 ? (o.shape == 4 ? "es" : "s") : "") + " " +
       kPlaces[static_cast<size_t>(o.place)];
  return s;
}

std::string shard_name(const std::string& dir, const char* stem, int64_t shard) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s-%05lld.tar", stem, static_cast<long long>(shard));
  return dir + "/" + name;
}

std::string sample_key(int64_t index) {
  char key[32];
  std::snprintf(key, sizeof(key), "%08lld", static_cast<long long>(index));
  return key;
}

// The file of one split: `name` under `<out>/<dir>`, made with its directory.
void write_text_file(const SynthOptions& o, const char* dir, const char* name, const std::string& text) {
  io::make_directories(o.out + "/" + dir);
  io::write_file_atomic(o.out + "/" + dir + "/" + name, std::vector<char>(text.begin(), text.end()));
}

}  // namespace

SynthScene render_scene(uint64_t seed, uint64_t stream, int64_t index, int64_t image_size) {
  if (image_size < 16) throw std::invalid_argument("synthetic images need at least 16 pixels, not " +
                                                   std::to_string(image_size));
  std::mt19937_64 rng(hash_of(seed, stream, static_cast<uint64_t>(index)));
  SynthScene scene;
  Image& img = scene.image;
  img.width = img.height = image_size;
  img.rgb.resize(static_cast<size_t>(image_size * image_size * 3));
  // a dark background with a faint vertical gradient (no noise: the PNGs stay small)
  const int base = 20 + static_cast<int>(rng() % 30);
  for (int64_t y = 0; y < image_size; ++y) {
    for (int64_t x = 0; x < image_size; ++x) {
      for (int ch = 0; ch < 3; ++ch) {
        img.rgb[static_cast<size_t>((y * image_size + x) * 3 + ch)] =
            static_cast<uint8_t>(base + (y * 20) / image_size);
      }
    }
  }
  const int kinds = 1 + static_cast<int>(rng() % 2);
  std::vector<Object> objects;
  std::vector<int> places = {0, 1, 2, 3, 4};
  for (int k = 0; k < kinds; ++k) {
    const size_t pick = rng() % places.size();  // different places, so copies do not overlap
    Object o;
    o.place = places[pick];
    places.erase(places.begin() + static_cast<long>(pick));
    o.shape = static_cast<int>(rng() % kShapes.size());
    o.colour = static_cast<int>(rng() % kColours.size());
    o.large = rng() % 2 == 0;
    o.count = 1 + static_cast<int>(rng() % (o.large ? 2 : 3));
    objects.push_back(o);
  }
  for (const auto& o : objects) {
    for (const auto& [cx, cy] : centres(o.place, o.count, o.large, rng)) draw(img, o, cx, cy);
  }
  scene.caption = kOpenings[rng() % kOpenings.size()];
  for (size_t k = 0; k < objects.size(); ++k) {
    scene.objects.push_back(describe(objects[k]));
    scene.caption += (k ? " and " : "") + scene.objects.back();
  }
  scene.label = objects[0].shape;
  return scene;
}

// Pair `index`, MRPC-like: the first caption from one scene; the second, half of the time, the same scene said
// another way (another opening, its objects in reverse order: label 1), else the caption of another scene whose first
// object has the same shape (label 0), so that a shared shape word does not give the answer away.
SynthPair synth_pair(uint64_t seed, bool eval, int64_t index) {
  const uint64_t stream = eval ? 6 : 5;
  const SynthScene first = render_scene(seed, stream, 1000 * index, 16);
  SynthPair p;
  p.first = first.caption;
  const uint64_t h = hash_of(seed, stream, static_cast<uint64_t>(index));
  p.label = unit_of(h) < 0.5 ? 1 : 0;
  if (p.label == 1) {
    p.second = kOpenings[(h >> 8) % kOpenings.size()];
    for (size_t k = first.objects.size(); k-- > 0;) {
      p.second += (k + 1 == first.objects.size() ? "" : " and ") + first.objects[k];
    }
    return p;
  }
  for (int64_t k = 1; k < 1000; ++k) {  // a shape is 1 in 5: the search ends within a few scenes
    const SynthScene other = render_scene(seed, stream, 1000 * index + k, 16);
    if (other.label == first.label && other.caption != first.caption) {
      p.second = other.caption;
      break;
    }
  }
  return p;
}

namespace {

// Each writer returns the number of files it wrote (0 when its count is 0) and adds its training texts to
// `captions` (the vocabulary's corpus; held-out texts stay out of it).
int64_t write_pairs(const SynthOptions& o, std::vector<std::string>& captions) {
  int64_t files = 0;
  for (const bool eval : {false, true}) {
    const int64_t pairs = eval ? o.pair_samples / 4 : o.pair_samples;
    if (pairs == 0) continue;
    std::string table = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n";
    for (int64_t i = 0; i < pairs; ++i) {
      const SynthPair p = synth_pair(o.seed, eval, i);
      table += std::to_string(p.label) + "\t" + std::to_string(2 * i) + "\t" + std::to_string(2 * i + 1) + "\t" +
               p.first + "\t" + p.second + "\n";
      if (!eval) captions.push_back(p.first), captions.push_back(p.second);
    }
    write_text_file(o, "pairs", eval ? "eval.tsv" : "train.tsv", table);
    ++files;
  }
  return files;
}

int64_t write_seq2seq(const SynthOptions& o, std::vector<std::string>& captions) {
  int64_t files = 0;
  for (const bool eval : {false, true}) {
    const int64_t records = eval ? o.seq2seq_samples / 4 : o.seq2seq_samples;
    if (records == 0) continue;
    std::string lines;
    for (int64_t i = 0; i < records; ++i) {
      const SynthScene scene = render_scene(o.seed, eval ? 8 : 7, i, 16);  // streams 5, 6: the pairs
      lines += nlohmann::json{{"input", scene.caption}, {"target", scene.objects.at(0)}}.dump() + "\n";
      if (!eval) captions.push_back(scene.caption);
    }
    write_text_file(o, "seq2seq", eval ? "eval.jsonl" : "train.jsonl", lines);
    ++files;
  }
  return files;
}

// A caption's words tagged as named entities: an object is its size, colour and shape words ("small red
// circles": B-OBJ I-OBJ I-OBJ), a location the word of its place ("left": B-LOC), every other word O.
std::vector<std::pair<std::string, const char*>> tagged_words(const std::string& caption) {
  auto is_object_word = [](const std::string& w) {
    if (w == "small" || w == "large") return true;
    for (const Colour& c : kColours) {
      if (w == c.name) return true;
    }
    for (const char* shape : kShapes) {
      if (w.rfind(shape, 0) == 0) return true;  // "crosses", "circles"
    }
    return false;
  };
  std::vector<std::pair<std::string, const char*>> out;
  size_t start = 0;
  while (start < caption.size()) {
    size_t end = caption.find(' ', start);
    if (end == std::string::npos) end = caption.size();
    const std::string w = caption.substr(start, end - start);
    start = end + 1;
    if (w.empty()) continue;
    const char* tag = "O";
    if (is_object_word(w)) {
      const bool inside = !out.empty() && std::string(out.back().second).find("OBJ") != std::string::npos;
      tag = inside && w != "small" && w != "large" ? "I-OBJ" : "B-OBJ";
    } else if (w == "left" || w == "right" || w == "top" || w == "bottom" || w == "middle") {
      tag = "B-LOC";
    }
    out.emplace_back(w, tag);
  }
  return out;
}

// CoNLL-2003's own layout: a -DOCSTART- line, then one word per line (word, part of speech, chunk, entity tag),
// a blank line after each sentence.
int64_t write_ner(const SynthOptions& o, std::vector<std::string>& captions) {
  int64_t files = 0;
  for (const bool eval : {false, true}) {
    const int64_t sentences = eval ? o.ner_samples / 4 : o.ner_samples;
    if (sentences == 0) continue;
    std::string text = "-DOCSTART- -X- -X- O\n\n";
    for (int64_t i = 0; i < sentences; ++i) {
      const SynthScene scene = render_scene(o.seed, eval ? 10 : 9, i, 16);
      for (const auto& [word, tag] : tagged_words(scene.caption)) text += word + " NN O " + tag + "\n";
      text += "\n";
      if (!eval) captions.push_back(scene.caption);
    }
    write_text_file(o, "ner", eval ? "valid.conll" : "train.conll", text);
    ++files;
  }
  return files;
}

}  // namespace

std::vector<std::string> clear_earlier_synth(const std::string& out) {
  if (!io::path_exists(out)) return {};
  if (!io::is_directory(out)) throw std::invalid_argument("data synth: '" + out + "' is a file, not a directory");
  static const std::array<const char*, 8> ours = {"image_text", "text", "image", "eval", "pairs", "seq2seq", "ner",
                                                  "vocab.txt"};
  std::vector<std::string> earlier, others;
  for (const std::string& name : io::list_directory(out)) {
    const bool synth = std::find(ours.begin(), ours.end(), name) != ours.end();
    (synth ? earlier : others).push_back(name);
  }
  if (!others.empty()) {
    std::string listed;
    for (size_t i = 0; i < others.size() && i < 3; ++i) listed += (i ? ", " : "") + others[i];
    if (others.size() > 3) listed += ", ... (" + std::to_string(others.size()) + " in all)";
    throw std::invalid_argument("data synth: '" + out + "' holds what data synth does not write (" + listed +
                                "): give a new or empty --out, or the directory of an earlier data synth (replaced)");
  }
  for (const std::string& name : earlier) io::remove_tree(out + "/" + name);
  return earlier;
}

int64_t write_synth_dataset(const SynthOptions& o, const std::function<void(int64_t, int64_t)>& progress) {
  if (o.out.empty()) throw std::invalid_argument("data synth: no output directory");
  clear_earlier_synth(o.out);
  if (o.samples_per_shard < 1) throw std::invalid_argument("data synth: samples_per_shard must be positive");
  for (int64_t n : {o.image_text_samples, o.text_samples, o.image_samples, o.eval_samples, o.pair_samples,
                    o.seq2seq_samples, o.ner_samples}) {
    if (n < 0) throw std::invalid_argument("data synth: a negative sample count (" + std::to_string(n) + ")");
  }
  struct Split {
    const char* dir;
    const char* stem;
    int64_t samples;
    uint64_t stream;
    bool image, text;
  };
  const Split splits[] = {{"image_text", "train", o.image_text_samples, 1, true, true},
                          {"text", "text", o.text_samples, 2, false, true},
                          {"image", "image", o.image_samples, 3, true, false},
                          {"eval", "eval", o.eval_samples, 4, true, true}};
  const int64_t total = o.image_text_samples + o.text_samples + o.image_samples + o.eval_samples;
  int64_t done = 0, files = 0;
  std::vector<std::string> captions;
  for (const Split& split : splits) {
    if (split.samples == 0) continue;
    const std::string dir = o.out + "/" + split.dir;
    io::make_directories(dir);
    for (int64_t first = 0; first < split.samples; first += o.samples_per_shard) {
      TarWriter tar(shard_name(dir, split.stem, first / o.samples_per_shard));
      for (int64_t i = first; i < std::min(split.samples, first + o.samples_per_shard); ++i) {
        const SynthScene scene = render_scene(o.seed, split.stream, i, o.image_size);
        const std::string key = sample_key(i);
        if (split.image) tar.add(key + ".png", encode_png(scene.image));
        if (split.text) {
          tar.add(key + ".txt", scene.caption);
          if (split.stream != 4) captions.push_back(scene.caption);  // the vocabulary never sees held-out text
        }
        tar.add(key + ".cls", std::to_string(scene.label));
        if (progress && (++done % 256 == 0 || done == total)) progress(done, total);
      }
      tar.finish();
      ++files;
    }
  }
  files += write_pairs(o, captions) + write_seq2seq(o, captions) + write_ner(o, captions);
  VocabOptions vocab;
  vocab.size = o.vocab_size;
  vocab.min_frequency = 1;
  save_vocab(build_vocab(captions, vocab), o.out + "/vocab.txt");
  if (progress && done % 256 != 0) progress(total, total);
  return files + 1;
}

}  // namespace shardtrain::data
