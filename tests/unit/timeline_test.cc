// The timeline file (runtime/timeline.h): valid Chrome-trace JSON after every write, rotated
// beyond its size limit (PATH and PATH.1 each within it, each naming its rows), and the
// errors of a path that cannot be written.
#include "runtime/timeline.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace braid {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/braid-timeline-", getpid(), "-", name);
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The file parsed as a JSON array (a failure if it is not one).
nlohmann::json Parse(const std::string& path) {
  const std::string text = Read(path);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_array()) << path << ":\n" << text.substr(0, 400);
  return j;
}

void Emit(Timeline& t, int steps) {
  for (int step = 0; step < steps; ++step) {
    for (int k = 0; k < 5; ++k) {
      const std::string tensor = absl::StrCat("layer", k, ".weight");
      t.Begin(tensor, "ALLREDUCE", absl::StrCat("\"bucket\": ", step));
      t.End(tensor, "ALLREDUCE");
    }
  }
}

TEST(TimelineTest, RotatesBeyondItsLimitAndEachFileStandsAlone) {
  const std::string path = TempPath("rotate.json");
  std::remove(path.c_str());
  std::remove((path + ".1").c_str());
  TimelineOptions o;
  o.max_bytes = 65536;
  int64_t rotations = 0;
  {
    auto t = Timeline::Open(path, 0, o);
    ASSERT_TRUE(t.ok()) << t.status();
    Emit(**t, 2000);  // ~20,000 events of ~90 bytes: about 28 files' worth
    (*t)->Flush();
    rotations = (*t)->rotations();
  }
  EXPECT_GE(rotations, 20);
  for (const std::string& p : {path, path + ".1"}) {
    EXPECT_LE(static_cast<int64_t>(Read(p).size()), o.max_bytes) << p;
    nlohmann::json j = Parse(p);
    std::set<std::string> named;
    size_t phases = 0;
    for (const auto& e : j) {
      if (e["ph"] == "M") named.insert(e["args"]["name"].get<std::string>());
      if (e["ph"] == "B" || e["ph"] == "E") ++phases;
    }
    EXPECT_EQ(named.size(), 5u) << p;  // every row keeps its name in every file
    // PATH.1 is a full file (~700 events), PATH what came after it.
    EXPECT_GT(phases, p == path ? 0u : 500u) << p;
  }
  std::remove(path.c_str());
  std::remove((path + ".1").c_str());
}

// Every event in a batch of its own, so every rotation comes at a batch's first event, over
// a range of limits so that some event ends exactly at one: the file closed then must not
// keep the last batch's trailing newline beyond its limit (it did, one byte over).
TEST(TimelineTest, AFileRotatedBetweenBatchesStaysWithinItsLimit) {
  const std::string path = TempPath("rotate_batches.json");
  for (int64_t limit = 1000; limit < 1100; ++limit) {
    std::remove(path.c_str());
    std::remove((path + ".1").c_str());
    TimelineOptions o;
    o.max_bytes = limit;
    int64_t rotations = 0;
    {
      auto t = Timeline::Open(path, 0, o);
      ASSERT_TRUE(t.ok()) << t.status();
      for (int i = 0; i < 40; ++i) {
        (*t)->Begin("w", "ALLREDUCE", "", absl::UnixEpoch());  // every event the same size
        (*t)->Flush();
      }
      rotations = (*t)->rotations();
    }
    ASSERT_GE(rotations, 1) << limit;
    for (const std::string& p : {path, path + ".1"}) {
      ASSERT_LE(static_cast<int64_t>(Read(p).size()), limit) << p;
      ASSERT_FALSE(Parse(p).empty()) << p;
    }
  }
  std::remove(path.c_str());
  std::remove((path + ".1").c_str());
}

TEST(TimelineTest, WithoutALimitOneFileHoldsEverything) {
  const std::string path = TempPath("unlimited.json");
  std::remove((path + ".1").c_str());
  TimelineOptions o;
  o.max_bytes = 0;
  {
    auto t = Timeline::Open(path, 3, o);
    ASSERT_TRUE(t.ok()) << t.status();
    Emit(**t, 300);
    (*t)->Flush();
    EXPECT_EQ((*t)->rotations(), 0);
    EXPECT_EQ(Parse(path).size(), 5u + 3000u);  // the rows' names, then every event
  }
  EXPECT_NE(access((path + ".1").c_str(), F_OK), 0);
  std::remove(path.c_str());
}

TEST(TimelineTest, AnUnwritablePathIsInvalidArgument) {
  auto dir = Timeline::Open("/tmp", 0);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.status().message(), "BRAID_TIMELINE='/tmp' is a directory; give a file path");
  auto missing = Timeline::Open("/nonexistent-dir/t.json", 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace braid
