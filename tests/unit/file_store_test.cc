// FileStore over a real temporary directory, including a value published by another process.
#include <dirent.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/store.h"

namespace braid {
namespace {

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "braid_file_store_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(std::system(("rm -rf '" + dir_ + "'").c_str()), 0); }

  // Names of the entries in `dir`, without "." and "..".
  static std::set<std::string> List(const std::string& dir) {
    std::set<std::string> names;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return names;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.insert(n);
    }
    ::closedir(d);
    return names;
  }

  std::string dir_;
};

TEST_F(FileStoreTest, SetThenGet) {
  FileStore store(dir_);
  ASSERT_TRUE(store.Set("rank0/addr", "10.0.0.1:1234").ok());
  absl::StatusOr<std::string> v = store.Get("rank0/addr", absl::Seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "10.0.0.1:1234");

  // Binary values (a UCX worker address has NUL bytes), empty values, overwrites.
  const std::string binary("a\0b\xff\n", 5);
  ASSERT_TRUE(store.Set("bin", binary).ok());
  EXPECT_EQ(*store.Get("bin", absl::Seconds(1)), binary);
  ASSERT_TRUE(store.Set("empty", "").ok());
  EXPECT_EQ(*store.Get("empty", absl::Seconds(1)), "");
  ASSERT_TRUE(store.Set("bin", "replaced").ok());
  EXPECT_EQ(*store.Get("bin", absl::Seconds(1)), "replaced");

  // A second store over the same directory sees the same values.
  FileStore other(dir_);
  EXPECT_EQ(*other.Get("rank0/addr", absl::Seconds(1)), "10.0.0.1:1234");
}

TEST_F(FileStoreTest, SetCreatesMissingDirectories) {
  const std::string nested = dir_ + "/a/b/c";
  FileStore store(nested);
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_EQ(*store.Get("k", absl::Seconds(1)), "v");
  // No temporary file is left behind.
  EXPECT_EQ(List(nested).size(), 1u);
}

TEST_F(FileStoreTest, SetFailsWhenDirectoryIsAFile) {
  FileStore file_maker(dir_);
  ASSERT_TRUE(file_maker.Set("plain", "x").ok());
  const std::set<std::string> names = List(dir_);
  ASSERT_EQ(names.size(), 1u);
  FileStore store(dir_ + "/" + *names.begin());
  EXPECT_FALSE(store.Set("k", "v").ok());
}

TEST_F(FileStoreTest, GetOfMissingKeyTimesOut) {
  FileStore store(dir_);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> v = store.Get("never/set", absl::Milliseconds(300));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "'never/set'")) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), dir_)) << v.status();
  EXPECT_GE(elapsed, 0.3);
  EXPECT_LT(elapsed, 2.0);
}

TEST_F(FileStoreTest, ZeroTimeoutChecksOnce) {
  FileStore store(dir_);
  EXPECT_EQ(store.Get("absent", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(store.Set("present", "1").ok());
  EXPECT_EQ(*store.Get("present", absl::ZeroDuration()), "1");
  EXPECT_TRUE(store.Wait({"present"}, absl::ZeroDuration()).ok());
}

TEST_F(FileStoreTest, WaitNamesOnlyTheMissingKeys) {
  FileStore store(dir_);
  ASSERT_TRUE(store.Set("here", "1").ok());
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = store.Wait({"here", "gone1", "gone2"}, absl::Milliseconds(200));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "'gone1'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "'gone2'")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "'here'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), dir_)) << s;
  EXPECT_GE(elapsed, 0.2);
  EXPECT_LT(elapsed, 2.0);
  EXPECT_TRUE(store.Wait({}, absl::ZeroDuration()).ok());
}

TEST_F(FileStoreTest, WaitReturnsWhenAnotherThreadSets) {
  FileStore store(dir_);
  std::thread writer([this] {
    FileStore w(dir_);
    for (int r = 0; r < 4; ++r) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_TRUE(w.Set("rank" + std::to_string(r), std::to_string(r)).ok());
    }
  });
  absl::Status s = store.Wait({"rank0", "rank1", "rank2", "rank3"}, absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(*store.Get("rank3", absl::ZeroDuration()), "3");
}

TEST_F(FileStoreTest, ValueFromForkedChildIsSeen) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::usleep(100 * 1000);  // let the parent start waiting
    FileStore child(dir_);
    ::_exit(child.Set("child/addr", "from-" + std::to_string(::getpid())).ok() ? 0 : 1);
  }
  FileStore parent(dir_);
  absl::StatusOr<std::string> v = parent.Get("child/addr", absl::Seconds(10));
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "from-" + std::to_string(pid));
}

TEST_F(FileStoreTest, KeysWithSlashesAndSpecialNamesStayDistinct) {
  FileStore store(dir_);
  const std::vector<std::string> keys = {"a/b", "a_b", "a%2Fb", "a%b", "/", "..", ".", "",
                                         "a/b.tmp.1.0", "../escape", "x/../../y"};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(store.Set(keys[i], "value" + std::to_string(i)).ok()) << keys[i];
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::string> v = store.Get(keys[i], absl::Seconds(1));
    ASSERT_TRUE(v.ok()) << keys[i] << ": " << v.status();
    EXPECT_EQ(*v, "value" + std::to_string(i)) << keys[i];
  }
  // One plain file per key, all inside the directory, no subdirectories, nothing outside.
  const std::set<std::string> names = List(dir_);
  EXPECT_EQ(names.size(), keys.size());
  for (const std::string& n : names) {
    EXPECT_TRUE(n.find('/') == std::string::npos && n != "." && n != "..") << n;
    EXPECT_TRUE(List(dir_ + "/" + n).empty()) << n << " is a directory";
  }
  const std::string parent = dir_.substr(0, dir_.rfind('/'));
  EXPECT_EQ(List(parent).count("escape"), 0u);
}

}  // namespace
}  // namespace braid
