// The docs cannot drift from the code: every file and symbol a chapter names in `backticks` must
// exist, every local link must resolve, and every rung directory must have its chapter.
//
// What counts as a name, in the Markdown of README.md and docs/**/*.md:
//   * an inline code span with no spaces that looks like a repo path: it starts with one of the
//     repo's top-level folders (common/ steps/ tests/ bench/ capi/ docs/ scripts/ cmake/ .ci/),
//     or it ends in a source or doc extension (.cpp .cu .hpp .py .md ...). A bare file name
//     (`naive_eigen.cu`) must exist somewhere in the tree; anything with a '/' must exist at that
//     path from the source root. A trailing `:line` or `#anchor` is ignored; paths under build/
//     and patterns (`steps/NN_name/`, `tests/test_<rung>.cpp`) are not files and are skipped.
//   * in a code span with spaces (a command such as `diff steps/00_.../a.cu steps/01_.../b.cu`) and
//     in fenced code blocks: each word that starts with one of those folders.
//   * an inline code span that looks like a C++ name and is qualified (`fl::standard::io_model`),
//     called (`merge()`), a kernel (`softmax_kernel`), snake_case (`softmax_reads`) or CamelCase
//     (`TwinTrafficMatchesClosedForm`): each part between '::' must occur as a whole word in the
//     sources under common/ steps/ tests/ bench/ capi/ cmake/. Short plain words (`merge`) and
//     names with a double underscore (`__syncthreads`, profiler metrics) are not checked.
//   * a Markdown link to a local file, [text](path): the path must exist, relative to the page.
//
// The source root comes from the build: FL_SOURCE_DIR (tests/CMakeLists.txt sets it).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef FL_SOURCE_DIR
#error "FL_SOURCE_DIR must be defined as the source root (see tests/CMakeLists.txt)"
#endif

namespace fl::testing {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot{FL_SOURCE_DIR};

const std::vector<std::string> kRepoDirs = {"common/", "steps/",  "tests/", "bench/", "capi/",
                                            "docs/",   "scripts/", "cmake/", ".ci/",   "labs/"};
const std::vector<std::string> kFileExts = {".cpp", ".cu",  ".hpp", ".cuh", ".h",   ".py",
                                            ".sh",  ".md",  ".txt", ".json", ".cmake"};
// Where a symbol named in the docs must be defined or used.
const std::vector<std::string> kSourceDirs = {"common", "steps", "tests", "bench", "capi", "cmake", "labs"};
const std::vector<std::string> kSourceExts = {".cpp", ".cu", ".hpp", ".cuh", ".h",
                                              ".py",  ".sh", ".txt", ".cmake"};

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
bool has_space(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Build folders and version control are not part of the sources.
bool skipped_dir(const fs::path& p) {
  const std::string n = p.filename().string();
  return n == ".git" || starts_with(n, "build") || n == "__pycache__" || n == ".deps";
}

template <class Fn>
void walk(const fs::path& dir, Fn fn) {
  if (!fs::is_directory(dir)) return;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_directory() && skipped_dir(it->path())) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) fn(it->path());
  }
}

// Everything the checks look names up in, read once.
struct Corpus {
  std::set<std::string> words;      // identifiers in the sources
  std::set<std::string> basenames;  // file names anywhere in the tree

  static const Corpus& get() {
    static const Corpus c = build();
    return c;
  }

 private:
  static Corpus build() {
    Corpus c;
    walk(kRoot, [&](const fs::path& p) { c.basenames.insert(p.filename().string()); });
    for (const std::string& d : kSourceDirs)
      walk(kRoot / d, [&](const fs::path& p) {
        const std::string ext = p.extension().string();
        const bool source = std::find(kSourceExts.begin(), kSourceExts.end(), ext) != kSourceExts.end() ||
                            p.filename() == "CMakeLists.txt";
        // This file names symbols in its own examples; it must not vouch for them.
        if (!source || p.filename() == "test_docs.cpp") return;
        const std::string text = read_file(p);
        std::string w;
        for (char ch : text + " ") {
          if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') {
            w += ch;
          } else if (!w.empty()) {
            c.words.insert(w);
            w.clear();
          }
        }
      });
    return c;
  }
};

// `steps/NN_name/`, `tests/test_<rung>.cpp`, `OUTDIR/ladder.json`: a pattern, not a file. A path
// part that begins with a run of two or more capitals ending at '_' or at the part's end
// (NN_name, OUTDIR, DIR) is a placeholder; README.md and CMakeLists.txt are not.
bool is_pattern(const std::string& p) {
  if (p.find_first_of("<>*?{}[]$~|") != std::string::npos) return true;
  if (p.find("...") != std::string::npos || p.find("…") != std::string::npos) return true;
  std::stringstream ss(p);
  std::string part;
  while (std::getline(ss, part, '/')) {
    size_t n = 0;
    while (n < part.size() && std::isupper(static_cast<unsigned char>(part[n]))) ++n;
    if (n >= 2 && (n == part.size() || part[n] == '_')) return true;
  }
  return false;
}

// "./scripts/test.sh" -> "scripts/test.sh"; "a.cu:12" -> "a.cu"; "x.md#numerics" -> "x.md".
std::string normalise_path(std::string p) {
  while (!p.empty() && std::string(",;:.)\"'").find(p.back()) != std::string::npos) p.pop_back();
  while (starts_with(p, "./")) p = p.substr(2);
  if (const auto h = p.find('#'); h != std::string::npos) p = p.substr(0, h);
  static const std::regex line_suffix(R"((:\d+)+(-\d+)?$)");
  return std::regex_replace(p, line_suffix, "");
}

bool under_build(const std::string& p) { return starts_with(p, "build/") || starts_with(p, "build-"); }

bool has_repo_prefix(const std::string& p) {
  return std::any_of(kRepoDirs.begin(), kRepoDirs.end(), [&](const std::string& d) { return starts_with(p, d); });
}

// An inline code span (no spaces) that names a file of the repo.
bool looks_like_path(const std::string& span) {
  if (span.empty() || has_space(span) || starts_with(span, "/") || span.find("://") != std::string::npos)
    return false;
  const std::string p = normalise_path(span);
  if (p.empty()) return false;
  if (p.find('/') != std::string::npos && has_repo_prefix(p)) return true;
  if (p.front() == '.' && p.find('/') == std::string::npos) return false;  // `.cu`: a kind of file
  return std::any_of(kFileExts.begin(), kFileExts.end(), [&](const std::string& e) { return ends_with(p, e); });
}

// An inline code span that names a symbol the sources must have: qualified (`fl::merge`), called
// (`merge()`), a kernel (`softmax_kernel`), or a bare name too particular to be an ordinary word:
// snake_case (`softmax_reads`) or CamelCase with two capitals (a test's name). Plain words
// (`merge`, `load`) and names with a double underscore (CUDA intrinsics, profiler metrics) are
// left alone.
bool looks_like_symbol(const std::string& span) {
  static const std::regex symbol(R"(^(fl::)?[A-Za-z_][A-Za-z0-9_:]*(\(\))?$)");
  if (!std::regex_match(span, symbol)) return false;
  if (span.find("::") != std::string::npos || ends_with(span, "()") || ends_with(span, "_kernel")) return true;
  if (span.find("__") != std::string::npos) return false;
  const auto upper = std::count_if(span.begin(), span.end(), [](unsigned char c) { return std::isupper(c); });
  const bool lower = std::any_of(span.begin(), span.end(), [](unsigned char c) { return std::islower(c); });
  return (span.find('_') != std::string::npos && span.front() != '_') || (upper >= 2 && lower);
}

// Checks one path; returns an empty string when it exists, else what is wrong.
std::string check_path(const std::string& raw, const fs::path& page_dir, bool relative_to_page) {
  const std::string p = normalise_path(raw);
  if (p.empty() || under_build(p) || is_pattern(p)) return "";
  if (relative_to_page) {
    if (fs::exists(page_dir / p)) return "";
    const std::string rel = fs::relative(page_dir, kRoot).generic_string();
    return "links to '" + raw + "', which does not exist (relative to " +
           (rel == "." ? std::string("the repo root") : rel + "/") + ")";
  }
  if (p.find('/') == std::string::npos) {
    if (Corpus::get().basenames.count(p)) return "";
    return "names file '" + raw + "', which is nowhere in the source tree";
  }
  if (fs::exists(kRoot / p)) return "";
  return "names path '" + raw + "', which does not exist";
}

std::string check_symbol(const std::string& span) {
  std::string s = span;
  if (ends_with(s, "()")) s.resize(s.size() - 2);
  std::vector<std::string> missing;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t next = s.find("::", pos);
    const std::string part = s.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (!part.empty() && !Corpus::get().words.count(part)) missing.push_back(part);
    if (next == std::string::npos) break;
    pos = next + 2;
  }
  if (missing.empty()) return "";
  std::string m = "names symbol '" + span + "', but ";
  for (size_t i = 0; i < missing.size(); ++i) m += (i ? ", '" : "'") + missing[i] + "'";
  return m + " occurs in no source under common/ steps/ tests/ bench/ capi/ cmake/";
}

struct Problems {
  std::vector<std::string> paths, symbols, links;
  int paths_checked = 0, symbols_checked = 0, links_checked = 0;
};

// Words of a command or code block that name repo paths: `diff steps/a.cu steps/b.cu`.
void check_words(const std::string& text, const std::string& where, Problems& out) {
  std::stringstream ss(text);
  std::string w;
  while (ss >> w) {
    while (!w.empty() && std::string("\"'(`").find(w.front()) != std::string::npos) w.erase(0, 1);
    std::string p = w;
    while (starts_with(p, "./")) p = p.substr(2);
    if (!has_repo_prefix(p) || p.find("://") != std::string::npos) continue;
    ++out.paths_checked;
    if (std::string e = check_path(w, {}, false); !e.empty()) out.paths.push_back(where + ": " + e);
  }
}

// The anchor GitHub gives a heading: lower case, letters, digits, '_' and '-' kept, spaces to '-',
// punctuation and symbols dropped (those the docs use outside ASCII are listed; other non-ASCII
// characters, letters such as 'ᵀ', are kept).
std::string heading_anchor(const std::string& heading) {
  static const std::set<uint32_t> dropped = {0xB7,   0xD7,   0xB1,   0x2013, 0x2014, 0x2018, 0x2019, 0x201C,
                                             0x201D, 0x2026, 0x2192, 0x2190, 0x2248, 0x2264, 0x2265, 0x2212,
                                             0x221A, 0x2211, 0x2218, 0x2260, 0x2261};
  std::string out;
  for (std::size_t i = 0; i < heading.size();) {
    const unsigned char c = heading[i];
    const int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (len == 1) {
      if (std::isalnum(c) || c == '_' || c == '-') out += char(std::tolower(c));
      else if (c == ' ') out += '-';
      ++i;
      continue;
    }
    uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int k = 1; k < len && i + k < heading.size(); ++k) cp = (cp << 6) | (heading[i + k] & 0x3F);
    if (!dropped.count(cp)) out += heading.substr(i, len);
    i += len;
  }
  return out;
}

// The anchors of a page's headings (outside fenced code blocks).
std::set<std::string> page_anchors(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (starts_with(line, "```")) fenced = !fenced;
    if (fenced || !starts_with(line, "#")) continue;
    const std::size_t h = line.find_first_not_of('#');
    if (h != std::string::npos && line[h] == ' ') out.insert(heading_anchor(line.substr(h + 1)));
  }
  return out;
}

// Checks one Markdown page. `name` is how messages name it; `dir` is the folder links resolve in.
Problems check_markdown(const std::string& name, const std::string& text, const fs::path& dir) {
  Problems out;
  static const std::regex link(R"(\]\(([^)\s]+)(\s+"[^"]*")?\))");
  std::stringstream ss(text);
  std::string line;
  int lineno = 0;
  std::string fence;  // the fence that opened the current code block, empty outside one
  while (std::getline(ss, line)) {
    ++lineno;
    const std::string where = name + ":" + std::to_string(lineno);
    const size_t indent = line.find_first_not_of(' ');
    const std::string body = indent == std::string::npos ? "" : line.substr(indent);
    if (indent != std::string::npos && indent <= 3 && (starts_with(body, "```") || starts_with(body, "~~~"))) {
      const std::string marker = body.substr(0, 3);
      if (fence.empty()) fence = marker;
      else if (marker == fence) fence.clear();
      continue;
    }
    if (!fence.empty()) {
      check_words(line, where, out);
      continue;
    }
    // Inline code spans: a run of n backticks up to the next run of exactly n.
    std::string prose;  // the line with its code spans taken out, for the link check
    size_t i = 0;
    while (i < line.size()) {
      if (line[i] != '`') {
        prose += line[i++];
        continue;
      }
      size_t n = 0;
      while (i + n < line.size() && line[i + n] == '`') ++n;
      const std::string ticks(n, '`');
      size_t close = line.find(ticks, i + n);
      while (close != std::string::npos && close + n < line.size() && line[close + n] == '`')
        close = line.find(ticks, close + n + 1);
      if (close == std::string::npos) {  // an unmatched run is literal text
        prose += ticks;
        i += n;
        continue;
      }
      std::string span = line.substr(i + n, close - i - n);
      const size_t a = span.find_first_not_of(' '), b = span.find_last_not_of(' ');
      span = a == std::string::npos ? "" : span.substr(a, b - a + 1);
      i = close + n;
      prose += ' ';
      if (looks_like_path(span)) {
        ++out.paths_checked;
        if (std::string e = check_path(span, dir, false); !e.empty()) out.paths.push_back(where + ": " + e);
      } else if (looks_like_symbol(span)) {
        ++out.symbols_checked;
        if (std::string e = check_symbol(span); !e.empty()) out.symbols.push_back(where + ": " + e);
      } else if (has_space(span)) {
        check_words(span, where, out);
      }
    }
    for (auto it = std::sregex_iterator(prose.begin(), prose.end(), link); it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1].str();
      if (target.find("://") != std::string::npos || starts_with(target, "mailto:")) continue;
      ++out.links_checked;
      const std::size_t hash = target.find('#');
      const std::string file = target.substr(0, hash);
      if (!file.empty()) {
        if (std::string e = check_path(file, dir, true); !e.empty()) {
          out.links.push_back(where + ": " + e);
          continue;
        }
      }
      // A link into a page names one of its headings.
      if (hash != std::string::npos && (file.empty() || ends_with(file, ".md"))) {
        const std::string anchor = target.substr(hash + 1);
        const std::set<std::string> anchors = file.empty() ? page_anchors(text) : page_anchors(read_file(dir / file));
        if (!anchors.count(anchor))
          out.links.push_back(where + ": links to '" + target + "', but " + (file.empty() ? "this page" : file) +
                              " has no heading with the anchor '#" + anchor + "'");
      }
    }
  }
  return out;
}

// README.md and every page under docs/, in a fixed order.
std::vector<fs::path> pages() {
  std::vector<fs::path> v{kRoot / "README.md"};
  walk(kRoot / "docs", [&](const fs::path& p) {
    if (p.extension() == ".md") v.push_back(p);
  });
  std::sort(v.begin() + 1, v.end());
  return v;
}

Problems check_all() {
  Problems all;
  for (const fs::path& p : pages()) {
    const Problems one = check_markdown(fs::relative(p, kRoot).generic_string(), read_file(p), p.parent_path());
    all.paths.insert(all.paths.end(), one.paths.begin(), one.paths.end());
    all.symbols.insert(all.symbols.end(), one.symbols.begin(), one.symbols.end());
    all.links.insert(all.links.end(), one.links.begin(), one.links.end());
    all.paths_checked += one.paths_checked;
    all.symbols_checked += one.symbols_checked;
    all.links_checked += one.links_checked;
  }
  return all;
}

std::string listing(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += "\n  " + e;
  return s;
}

// ---- The docs as they are --------------------------------------------------------------------

TEST(Docs, SourceRootIsTheRepo) {
  ASSERT_TRUE(fs::exists(kRoot / "README.md")) << "FL_SOURCE_DIR=" << kRoot << " has no README.md";
  ASSERT_TRUE(fs::is_directory(kRoot / "steps")) << kRoot;
}

TEST(Docs, EveryNamedFileExists) {
  const Problems p = check_all();
  EXPECT_GT(p.paths_checked, 0) << "no file names found at all: is the extractor broken?";
  EXPECT_TRUE(p.paths.empty()) << p.paths.size() << " file name(s) in the docs point nowhere:"
                               << listing(p.paths);
}

TEST(Docs, EveryNamedSymbolExists) {
  const Problems p = check_all();
  EXPECT_GT(p.symbols_checked, 0) << "no symbols found at all: is the extractor broken?";
  EXPECT_TRUE(p.symbols.empty()) << p.symbols.size() << " symbol(s) in the docs are not in the code:"
                                 << listing(p.symbols);
}

TEST(Docs, EveryLocalLinkResolves) {
  const Problems p = check_all();
  EXPECT_TRUE(p.links.empty()) << p.links.size() << " link(s) in the docs are broken:" << listing(p.links);
}

// docs/NN_name.md beside every steps/NN_name/, and no chapter for a rung that is not there.
TEST(Docs, EveryRungHasItsChapter) {
  static const std::regex rung_dir(R"(^\d\d_[a-z0-9_]+$)");
  std::vector<std::string> missing;
  int rungs = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "steps")) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(n, rung_dir)) continue;
    ++rungs;
    if (!fs::exists(kRoot / "docs" / (n + ".md"))) missing.push_back("steps/" + n + "/ has no docs/" + n + ".md");
  }
  for (const auto& e : fs::directory_iterator(kRoot / "docs")) {
    const std::string stem = e.path().stem().string();
    if (e.path().extension() == ".md" && std::regex_match(stem, rung_dir) &&
        !fs::is_directory(kRoot / "steps" / stem))
      missing.push_back("docs/" + stem + ".md has no steps/" + stem + "/");
  }
  EXPECT_GT(rungs, 0);
  std::sort(missing.begin(), missing.end());
  EXPECT_TRUE(missing.empty()) << listing(missing);
}

// bench/report.py rewrites what lies between these markers, each alone on its line (a marker
// quoted in prose is not one); an unbalanced pair would make it refuse the page. Every begin has
// its end, and a rung's block names a rung that exists (a block of one kind of result for a rung,
// NN_name__KIND, by the part before "__").
TEST(Docs, ResultMarkersArePaired) {
  static const std::regex marker(R"(^\s*<!--\s*(results:([A-Za-z0-9_]+)|gpu-table):(begin|end)\s*-->\s*$)");
  std::vector<std::string> bad;
  for (const fs::path& p : pages()) {
    const std::string page = fs::relative(p, kRoot).generic_string();
    std::stringstream text(read_file(p));
    std::vector<std::string> open;
    std::string line;
    std::smatch mt;
    while (std::getline(text, line)) {
      if (!std::regex_match(line, mt, marker)) continue;
      const std::string name = mt[1].str(), rung = mt[2].str(), what = mt[3].str();
      if (what == "begin") {
        if (!open.empty()) bad.push_back(page + ": " + name + " begins inside " + open.back());
        open.push_back(name);
        const std::string step = rung.substr(0, rung.find("__"));
        if (!step.empty() && !fs::is_directory(kRoot / "steps" / step) && !fs::exists(kRoot / "docs" / (step + ".md")))
          bad.push_back(page + ": block " + name + " names no rung directory steps/" + step);
      } else if (open.empty() || open.back() != name) {
        bad.push_back(page + ": " + name + ":end without its begin");
      } else {
        open.pop_back();
      }
    }
    for (const std::string& o : open) bad.push_back(page + ": " + o + ":begin without its end");
  }
  EXPECT_TRUE(bad.empty()) << listing(bad);
}

// ---- Every chapter is a lesson in the same shape -----------------------------------------------
//
// docs/NN_name.md has the standard sections in order (other sections may stand between them),
// and links to the chapter before and after it at its top and at its end.

const std::vector<std::string> kStandardSections = {"The idea", "What changed since the previous rung", "The code",
                                                    "The numbers", "Numerics", "Exercises"};

// What is wrong with one chapter's shape; empty when nothing is.
std::vector<std::string> chapter_shape_problems(const std::string& text, const std::string& prev,
                                                const std::string& next) {
  std::vector<std::string> out;
  std::vector<std::string> h2, lines;
  std::istringstream in(text);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (starts_with(line, "```")) fenced = !fenced;
    if (!fenced && starts_with(line, "## ")) h2.push_back(line.substr(3));
    if (!line.empty()) lines.push_back(line);
  }
  std::size_t at = 0;
  for (const std::string& want : kStandardSections) {
    const auto it = std::find(h2.begin() + std::min(at, h2.size()), h2.end(), want);
    if (it == h2.end()) {
      out.push_back("no section '## " + want + "' (or it is out of order)");
    } else {
      at = std::size_t(it - h2.begin()) + 1;
    }
  }
  auto links_to = [](const std::string& l, const std::string& page) { return l.find("](" + page) != std::string::npos; };
  const std::string top = lines.size() > 1 ? lines[1] : "", bottom = lines.empty() ? "" : lines.back();
  for (const auto& [where, l] : {std::pair<std::string, std::string>{"top", top}, {"end", bottom}}) {
    if (!prev.empty() && !(l.find("Previous") != std::string::npos && links_to(l, prev)))
      out.push_back("no 'Previous' link to " + prev + " at its " + where);
    if (!next.empty() && !(l.find("Next") != std::string::npos && links_to(l, next)))
      out.push_back("no 'Next' link to " + next + " at its " + where);
  }
  return out;
}

TEST(Docs, EveryChapterHasTheStandardSectionsAndItsNeighbours) {
  std::vector<std::string> chapters;
  static const std::regex rung_dir(R"(^\d\d_[a-z0-9_]+$)");
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md" && std::regex_match(e.path().stem().string(), rung_dir))
      chapters.push_back(e.path().filename().string());
  std::sort(chapters.begin(), chapters.end());
  ASSERT_FALSE(chapters.empty());
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < chapters.size(); ++i)
    for (const std::string& p : chapter_shape_problems(read_file(kRoot / "docs" / chapters[i]),
                                                       i > 0 ? chapters[i - 1] : "",
                                                       i + 1 < chapters.size() ? chapters[i + 1] : ""))
      problems.push_back("docs/" + chapters[i] + ": " + p);
  EXPECT_TRUE(problems.empty()) << listing(problems);
}

TEST(DocsChecker, ChapterShapeIsChecked) {
  const std::string good =
      "# 01\nPrevious: [00](00_a.md) · Next: [02](02_b.md)\n## The idea\n## What changed since the previous rung\n"
      "## The code\n## Extra\n## The numbers\n## Numerics\n## Exercises\nPrevious: [00](00_a.md) · Next: [02](02_b.md)\n";
  EXPECT_TRUE(chapter_shape_problems(good, "00_a.md", "02_b.md").empty());
  const std::string bad = "# 01\nPrevious: [00](00_a.md)\n## The code\n## The idea\n## Numerics\n## Exercises\nbye\n";
  const auto p = chapter_shape_problems(bad, "00_a.md", "02_b.md");
  EXPECT_EQ(p.size(), 6u) << listing(p);  // The code after The idea, What changed, The numbers; links
}

// ---- Numbers in prose ------------------------------------------------------------------------------
//
// A paragraph that says which run it quotes (a GPU and a date, "H100, 2026-11-21") states numbers
// of that run, and they must be the numbers the results JSON gave: each number with a unit of time,
// speed or size (ms, TFLOP/s, GB/s, MiB, GiB, ×) must stand in a table bench/report.py wrote from
// docs/results/ (a block between its markers, on any page). A number marked as derived or
// approximate ("about", "~", "≈", "at least", "at most" just before it) is exempt. This is how a
// chapter's prose cannot go on quoting a run its tables no longer show.

// The blocks bench/report.py wrote into a page: where each begins (its begin marker), where its
// body begins and ends, and where it ends (past its end marker). Found by plain search: std::regex
// (libstdc++) recurses once a character on a pattern like [\s\S]*?, and appendix 08's block of
// runs (48 KB) overflowed the stack.
struct GeneratedBlock {
  std::size_t begin, body, body_end, end;
};
std::vector<GeneratedBlock> generated_blocks(const std::string& text) {
  static const std::regex open(R"(<!-- (results:\w+|gpu-table):begin -->)");
  std::vector<GeneratedBlock> out;
  for (auto m = std::sregex_iterator(text.begin(), text.end(), open); m != std::sregex_iterator(); ++m) {
    const std::size_t begin = std::size_t(m->position()), body = begin + std::size_t(m->length());
    if (!out.empty() && begin < out.back().end) continue;  // a marker quoted inside the block before
    const std::string close = "<!-- " + (*m)[1].str() + ":end -->";
    const std::size_t at = text.find(close, body);
    if (at != std::string::npos) out.push_back({begin, body, at, at + close.size()});
  }
  return out;
}

// The text with the generated blocks and the fenced code taken out.
std::string prose_of(const std::string& text) {
  std::string kept;
  std::size_t from = 0;
  for (const GeneratedBlock& b : generated_blocks(text)) {
    kept.append(text, from, b.begin - from);
    from = b.end;
  }
  kept.append(text, from, std::string::npos);
  std::string out;
  from = 0;
  for (std::size_t open; (open = kept.find("```", from)) != std::string::npos;) {
    const std::size_t close = kept.find("```", open + 3);
    if (close == std::string::npos) break;
    out.append(kept, from, open - from);
    from = close + 3;
  }
  out.append(kept, from, std::string::npos);
  return out;
}

std::set<std::string> generated_numbers() {
  static const std::regex number(R"(\d+(?:\.\d+)?)");
  std::set<std::string> out;
  for (const fs::path& p : pages()) {
    const std::string text = read_file(p);
    for (const GeneratedBlock& b : generated_blocks(text)) {
      const std::string body = text.substr(b.body, b.body_end - b.body);
      for (auto n = std::sregex_iterator(body.begin(), body.end(), number); n != std::sregex_iterator(); ++n)
        out.insert(n->str());
    }
  }
  return out;
}

// The stamped numbers of one page that no generated table holds.
std::vector<std::string> unbacked_numbers(const std::string& page, const std::string& text,
                                          const std::set<std::string>& known) {
  static const std::regex stamp(R"((H100|H200)[^)\n]{0,60}20\d\d-\d\d-\d\d)");
  static const std::regex quantity(R"((\d+(?:\.\d+)?)\s?(×|x\b| ms\b| TFLOP/s| GB/s| MiB| GiB))");
  static const std::regex hedge(R"((about|~|≈|at least|at most)\s*(\d+(\.\d+)?\s?(–|-)\s?)?$)");  // "~0.5–0.7×" too
  const std::string prose = prose_of(text);
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < prose.size()) {
    std::size_t end = prose.find("\n\n", start);
    if (end == std::string::npos) end = prose.size();
    const std::string para = prose.substr(start, end - start);
    start = end + 2;
    if (!std::regex_search(para, stamp)) continue;
    for (auto m = std::sregex_iterator(para.begin(), para.end(), quantity); m != std::sregex_iterator(); ++m) {
      const std::string before = para.substr(std::size_t(std::max<std::ptrdiff_t>(0, m->position() - 20)),
                                             std::size_t(std::min<std::ptrdiff_t>(20, m->position())));
      if (std::regex_search(before, hedge)) continue;
      if (!known.count((*m)[1].str())) out.push_back(page + ": '" + m->str() + "' is in no table of the results");
    }
  }
  return out;
}

TEST(Docs, StampedNumbersComeFromTheResults) {
  const std::set<std::string> known = generated_numbers();
  std::vector<std::string> bad;
  for (const fs::path& p : pages()) {
    const auto b = unbacked_numbers(fs::relative(p, kRoot).generic_string(), read_file(p), known);
    bad.insert(bad.end(), b.begin(), b.end());
  }
  EXPECT_TRUE(bad.empty()) << listing(bad);
}

TEST(DocsChecker, LongGeneratedBlocksAreRead) {
  const std::string body(4 << 20, 'x');  // 4 MiB: far past what a recursive match survives
  const std::string page = "Outcome (H100, 2026-11-21): 2.35 ms.\n\n<!-- results:a:begin -->\n" + body +
                           " 2.35 ms\n<!-- results:a:end -->\n```\n" + body + "\n```\ntail\n";
  const auto blocks = generated_blocks(page);
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(page.substr(blocks[0].body_end - 9, 9), " 2.35 ms\n");
  EXPECT_EQ(prose_of(page), "Outcome (H100, 2026-11-21): 2.35 ms.\n\n\n\ntail\n");
}

TEST(DocsChecker, StampedNumbersAreChecked) {
  const std::set<std::string> known = {"2.35", "60.6", "25.8"};
  const std::string page =
      "Outcome (H100, 2026-11-21): 2.35 ms against 60.6 ms, 25.8× faster.\n\n"
      "Outcome (H100, 2026-11-21): 2.37 ms, about 3.1× the rest, 9.9 TFLOP/s.\n\n"
      "No stamp: 1.23 ms.\n";
  const auto bad = unbacked_numbers("x.md", page, known);
  ASSERT_EQ(bad.size(), 2u) << listing(bad);
  EXPECT_NE(bad[0].find("2.37 ms"), std::string::npos);
  EXPECT_NE(bad[1].find("9.9 TFLOP/s"), std::string::npos);
}

// ---- Diffs: a chapter's promise of a one-idea diff is kept ------------------------------------
//
// A chapter gives each diff it asks the student to run as one line in a fenced code block,
//     diff steps/06_tensor_core_mma/v1_mma.cu steps/06_tensor_core_mma/v2_ldmatrix.cu   # 50 lines: ...
// with the count of lines a minimal diff marks changed ('<' or '>'), as `# N lines`. The check runs
// every such diff and fails when a file is missing, a count is missing, or the diff's length is
// not the one the chapter says (longer: the version grew past its idea; shorter: the count went
// stale when a shared part moved out, and a student counting the lines would not find it). Rungs 01-07 and every version file vK (K ≥ 2) of a rung must have theirs.

struct DiffClaim {
  std::string page, a, b;
  long claimed = -1;  // -1: the line states no count
};

std::vector<DiffClaim> diff_claims(const std::string& page, const std::string& text) {
  static const std::regex cmd(R"(^\s*diff\s+(\S+)\s+(\S+)(.*)$)");
  static const std::regex count(R"(#\s*(\d+)\s+lines?\b)");
  std::vector<DiffClaim> out;
  std::istringstream in(text);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (starts_with(line, "```")) {
      fenced = !fenced;
      continue;
    }
    std::smatch m, c;
    if (!fenced || !std::regex_match(line, m, cmd)) continue;
    DiffClaim d{page, m[1], m[2]};
    const std::string rest = m[3];
    if (std::regex_search(rest, c, count)) d.claimed = std::stol(c[1]);
    out.push_back(d);
  }
  return out;
}

// Lines a minimal diff of a and b marks changed ('<' or '>'): lines(a) + lines(b) − 2·LCS, what
// `diff --minimal a b | grep -c '^[<>]'` prints. Counted here, not by running diff, because diff
// programs differ on long rewrites (GNU diff without --minimal marks a few more). -1 if a file is
// missing.
long changed_lines(const fs::path& a, const fs::path& b) {
  auto lines = [](const fs::path& f, std::vector<std::string>* out) {
    std::ifstream in(f);
    if (!in) return false;
    for (std::string l; std::getline(in, l);) out->push_back(l);
    return true;
  };
  std::vector<std::string> x, y;
  if (!lines(a, &x) || !lines(b, &y)) return -1;
  std::vector<long> prev(y.size() + 1, 0), cur(y.size() + 1, 0);
  for (const std::string& xi : x) {
    for (std::size_t j = 0; j < y.size(); ++j) cur[j + 1] = xi == y[j] ? prev[j] + 1 : std::max(prev[j + 1], cur[j]);
    std::swap(prev, cur);
  }
  return long(x.size() + y.size()) - 2 * prev[y.size()];
}

std::vector<DiffClaim> all_diff_claims() {
  std::vector<DiffClaim> out;
  for (const fs::path& p : pages()) {
    const auto claims = diff_claims(fs::relative(p, kRoot).string(), read_file(p));
    out.insert(out.end(), claims.begin(), claims.end());
  }
  return out;
}

// A lab's diff (labs/NAME/FILE against its rung's file) counts the skeleton as shipped; in a build
// in student mode (-DFLASH_LADDER_LABS=student) the lab files are the student's work and change.
bool is_lab_claim(const DiffClaim& d) { return starts_with(d.a, "labs/") || starts_with(d.b, "labs/"); }

void expect_claims_hold(bool labs) {
  const auto claims = all_diff_claims();
  ASSERT_FALSE(claims.empty()) << "no diff command found in the docs";
  EXPECT_TRUE(std::any_of(claims.begin(), claims.end(), [&](const DiffClaim& d) { return is_lab_claim(d) == labs; }))
      << "no " << (labs ? "lab" : "chapter") << " diff found in the docs: this check would pass on nothing";
  for (const DiffClaim& d : claims) {
    if (is_lab_claim(d) != labs) continue;
    SCOPED_TRACE(d.page + ": diff " + d.a + " " + d.b);
    ASSERT_TRUE(fs::exists(kRoot / d.a)) << d.a << " does not exist";
    ASSERT_TRUE(fs::exists(kRoot / d.b)) << d.b << " does not exist";
    EXPECT_GE(d.claimed, 0) << "the line gives no count: end it with '# N lines: what changed'";
    const long n = changed_lines(kRoot / d.a, kRoot / d.b);
    ASSERT_GE(n, 0) << "diff failed";
    if (d.claimed >= 0) {
      EXPECT_EQ(n, d.claimed) << "the diff has " << n << " changed lines; the chapter says " << d.claimed;
    }
  }
}

TEST(Diffs, EveryDocumentedDiffHasTheLengthTheChapterSays) { expect_claims_hold(false); }

TEST(Diffs, EveryLabSkeletonDiffersFromItsAnswerAsLabsMdSays) {
#ifdef FL_LABS_STUDENT
  GTEST_SKIP() << "this build grades labs (-DFLASH_LADDER_LABS=student): the lab files are yours to change, "
                  "so their diff counts in docs/labs.md (the skeletons as shipped) are not checked";
#endif
  expect_claims_hold(true);
}

// Every rung from 01 has a diff against an earlier rung in its chapter, and every version file
// vK_*.{cu,cpp} from v2 on has `diff vK-1_* vK_*` in its rung's chapter.
TEST(Diffs, EveryRungAndVersionHasItsDiff) {
  const auto claims = all_diff_claims();
  auto given = [&](const std::string& page, auto pred) {
    return std::any_of(claims.begin(), claims.end(), [&](const DiffClaim& d) { return d.page == page && pred(d); });
  };
  std::vector<std::string> rungs;
  for (const auto& e : fs::directory_iterator(kRoot / "steps"))
    if (e.is_directory()) rungs.push_back(e.path().filename().string());
  std::sort(rungs.begin(), rungs.end());
  static const std::regex version(R"(v(\d+)_\w+\.(cu|cpp))");
  for (std::size_t i = 0; i < rungs.size(); ++i) {
    const std::string page = "docs/" + rungs[i] + ".md", dir = "steps/" + rungs[i] + "/";
    if (i > 0) {
      EXPECT_TRUE(given(page, [&](const DiffClaim& d) {
        return starts_with(d.a, "steps/") && !starts_with(d.a, dir) && d.a < dir && starts_with(d.b, dir);
      })) << page << " gives no diff from an earlier rung to " << dir;
    }
    std::map<int, std::string> files;  // version number -> file name
    for (const auto& e : fs::directory_iterator(kRoot / dir)) {
      std::smatch m;
      const std::string f = e.path().filename().string();
      if (std::regex_match(f, m, version)) files[std::stoi(m[1])] = f;
    }
    for (const auto& [k, f] : files) {
      if (!files.count(k - 1)) continue;
      const std::string a = dir + files.at(k - 1), b = dir + f;
      EXPECT_TRUE(given(page, [&](const DiffClaim& d) { return d.a == a && d.b == b; }))
          << page << " gives no `diff " << a << " " << b << "` with its count";
    }
  }
}

TEST(DiffsChecker, ReadsClaimsAndCountsLines) {
  const auto c = diff_claims("x.md", "```\ndiff a.cu b.cu   # 12 lines: the idea\ndiff c d\n```\ndiff e f # 3 lines\n");
  ASSERT_EQ(c.size(), 2u);  // the one outside a fenced block is prose, not a command
  EXPECT_EQ(c[0].a, "a.cu");
  EXPECT_EQ(c[0].claimed, 12);
  EXPECT_EQ(c[1].claimed, -1);
  const fs::path tmp = fs::temp_directory_path() / "fl_diff_check";
  fs::create_directories(tmp);
  std::ofstream(tmp / "a") << "1\n2\n3\n";
  std::ofstream(tmp / "b") << "1\nTWO\n3\n4\n";
  EXPECT_EQ(changed_lines(tmp / "a", tmp / "b"), 3);  // < 2, > TWO, > 4
  EXPECT_EQ(changed_lines(tmp / "a", tmp / "a"), 0);
  EXPECT_EQ(changed_lines(tmp / "a", tmp / "missing"), -1);
  fs::remove_all(tmp);
}

// ---- The checker itself: it must catch what it is for ------------------------------------------

TEST(DocsChecker, ClassifiesSpans) {
  EXPECT_TRUE(looks_like_path("steps/00_naive_eigen/naive_eigen.cu"));
  EXPECT_TRUE(looks_like_path("common/"));
  EXPECT_TRUE(looks_like_path("naive_eigen.cu"));
  EXPECT_TRUE(looks_like_path("./scripts/test.sh"));
  EXPECT_FALSE(looks_like_path("ctest -L 00_naive_eigen"));
  EXPECT_FALSE(looks_like_path("S = QKᵀ"));
  EXPECT_FALSE(looks_like_path("https://example.org/a.md"));
  EXPECT_TRUE(looks_like_symbol("fl::standard::io_model"));
  EXPECT_TRUE(looks_like_symbol("merge()"));
  EXPECT_TRUE(looks_like_symbol("softmax_kernel"));
  EXPECT_FALSE(looks_like_symbol("softmax"));
  EXPECT_TRUE(looks_like_symbol("softmax_reads"));
  EXPECT_TRUE(looks_like_symbol("TwinTrafficMatchesClosedForm"));
  EXPECT_FALSE(looks_like_symbol("dram__bytes"));
  EXPECT_FALSE(looks_like_symbol("Ladder"));
  EXPECT_FALSE(looks_like_symbol("exp(s - m)"));
  EXPECT_TRUE(is_pattern("steps/NN_name/"));
  EXPECT_TRUE(is_pattern("tests/test_<rung>.cpp"));
  EXPECT_FALSE(is_pattern("README.md"));
  EXPECT_FALSE(is_pattern("steps/00_naive_eigen/CMakeLists.txt"));
  EXPECT_EQ(normalise_path("steps/00_naive_eigen/naive_eigen.cu:22"), "steps/00_naive_eigen/naive_eigen.cu");
  EXPECT_EQ(normalise_path("docs/io_model.md#closed-form"), "docs/io_model.md");
}

TEST(DocsChecker, CatchesAMissingFileSymbolAndLink) {
  const std::string page =
      "A real one: `steps/00_naive_eigen/naive_eigen.cu:22`, `fl::standard::io_model`, [ok](../README.md).\n"
      "A file that is not there: `steps/00_naive_eigen/no_such_file.cu`.\n"
      "A symbol that is not there: `fl::standard::no_such_function`, and `no_such_kernel`.\n"
      "A command naming a missing file: `diff steps/00_naive_eigen/naive_eigen.cu steps/99_gone/x.cu`.\n"
      "A broken link: [gone](no_such_chapter.md).\n"
      "```sh\n"
      "python3 bench/no_such_script.py   # inside a fence, words with a repo folder are checked\n"
      "`fl::not_checked_inside_a_fence`\n"
      "```\n"
      "Patterns are not files: `steps/NN_name/`, `tests/test_<rung>.cpp`, `build/bench/ladder`.\n";
  const Problems p = check_markdown("planted.md", page, kRoot / "docs");
  ASSERT_EQ(p.paths.size(), 3u) << listing(p.paths);
  EXPECT_NE(p.paths[0].find("planted.md:2: "), std::string::npos) << p.paths[0];
  EXPECT_NE(p.paths[0].find("no_such_file.cu"), std::string::npos) << p.paths[0];
  EXPECT_NE(p.paths[1].find("planted.md:4: "), std::string::npos) << p.paths[1];
  EXPECT_NE(p.paths[2].find("planted.md:7: "), std::string::npos) << p.paths[2];
  ASSERT_EQ(p.symbols.size(), 2u) << listing(p.symbols);
  EXPECT_NE(p.symbols[0].find("planted.md:3: "), std::string::npos) << p.symbols[0];
  EXPECT_NE(p.symbols[0].find("'no_such_function'"), std::string::npos) << p.symbols[0];
  EXPECT_NE(p.symbols[1].find("no_such_kernel"), std::string::npos) << p.symbols[1];
  ASSERT_EQ(p.links.size(), 1u) << listing(p.links);
  EXPECT_NE(p.links[0].find("planted.md:5: "), std::string::npos) << p.links[0];
}

TEST(DocsChecker, CatchesABrokenAnchor) {
  EXPECT_EQ(heading_anchor("What is left: from FlashAttention-2 to cuDNN"), "what-is-left-from-flashattention-2-to-cudnn");
  EXPECT_EQ(heading_anchor("06 · Tensor cores"), "06--tensor-cores");
  EXPECT_EQ(heading_anchor("Sᵀ and dPᵀ"), "sᵀ-and-dpᵀ");
  const std::string page =
      "# A page\n## The numbers\n"
      "Good: [here](#the-numbers), [there](06_tensor_core_mma.md#the-idea).\n"
      "Broken: [here](#no-such-heading), [there](06_tensor_core_mma.md#no-such-section).\n";
  const Problems p = check_markdown("planted.md", page, kRoot / "docs");
  ASSERT_EQ(p.links.size(), 2u) << listing(p.links);
  EXPECT_NE(p.links[0].find("#no-such-heading"), std::string::npos) << p.links[0];
  EXPECT_NE(p.links[1].find("#no-such-section"), std::string::npos) << p.links[1];
}

}  // namespace
}  // namespace fl::testing
