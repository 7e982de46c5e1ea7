// Runs a libFuzzer target's LLVMFuzzerTestOneInput over saved inputs, in builds without
// libFuzzer (the normal gcc build and Bazel): every file named on the command line, or every
// file in a directory named there. So the seed corpus and every input that once broke an
// invariant (tests/fuzz/corpus) stay regression tests of the normal build.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> Files(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> out;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') out.push_back(path + "/" + e->d_name);
    }
    closedir(d);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  // Flags are ignored (the sanitizer suites pass gtest's to every test binary they run);
  // without a path, the corpus named at build time (BRAID_REPLAY_CORPUS) is replayed.
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') paths.push_back(argv[i]);
  }
#ifdef BRAID_REPLAY_CORPUS
  if (paths.empty()) paths.push_back(BRAID_REPLAY_CORPUS);
#endif
  int ran = 0;
  for (const std::string& path : paths) {
    const std::vector<std::string> files = Files(path);
    if (files.empty()) {
      std::fprintf(stderr, "replay: no inputs at %s\n", path.c_str());
      return 2;
    }
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::stringstream data;
      data << in.rdbuf();
      const std::string bytes = data.str();
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++ran;
    }
  }
  std::printf("replay: %d inputs, every invariant held\n", ran);
  return ran > 0 ? 0 : 2;
}
