// This process's threads by name (/proc/self/task/*/comm), and the number of braid's own
// threads per rank that docs/architecture.md states, for the tests that hold the two together
// (Note [Threads and locks], runtime/runtime_impl.h). Header-only.
#ifndef BRAID_TESTS_TESTING_THREAD_COUNT_H_
#define BRAID_TESTS_TESTING_THREAD_COUNT_H_

#include <dirent.h>

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>

namespace braid::testing {

// How many threads of this process have each name.
inline std::map<std::string, int> ThreadNames() {
  std::map<std::string, int> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    ++out[name];
  }
  closedir(d);
  return out;
}

// Threads whose name starts with "braid-": braid's own.
inline int BraidThreads() {
  int n = 0;
  for (const auto& [name, count] : ThreadNames()) n += name.rfind("braid-", 0) == 0 ? count : 0;
  return n;
}

// The number in docs/architecture.md's "a rank runs N threads of braid's own"; -1 when not
// found.
inline int StatedThreadsPerRank(const std::string& doc_path) {
  std::ifstream doc(doc_path);
  std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("a rank runs (\\d+) threads of braid's own"))) {
    return -1;
  }
  return std::stoi(m[1]);
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_THREAD_COUNT_H_
