// Runs a function on every rank of an in-process world (transport/local_communicator.h), one
// thread per rank, and joins them. gtest assertions are thread-safe, so the function may
// EXPECT_* freely; a fatal ASSERT_* only leaves its own thread.
#ifndef BRAID_TESTS_TESTING_LOCAL_WORLD_H_
#define BRAID_TESTS_TESTING_LOCAL_WORLD_H_

#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "transport/communicator.h"
#include "transport/context.h"
#include "transport/local_communicator.h"

namespace braid::testing {

// fn(rank, communicator) on `size` threads over CreateLocalCommunicators(size, options).
// Communicators are destroyed after every thread returned.
inline void RunLocalWorld(
    int size, const transport::CollectiveOptions& options,
    const std::function<void(int rank, transport::Communicator& comm)>& fn) {
  std::vector<std::unique_ptr<transport::Communicator>> comms =
      transport::CreateLocalCommunicators(size, options);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r, *comms[r]); });
  for (std::thread& t : threads) t.join();
}

// fn(rank, context) on `size` threads, each rank's Context over its in-process endpoint: for
// calling the algorithms of transport/collectives.h directly.
inline void RunLocalContexts(int size, const transport::CollectiveOptions& options,
                             const std::function<void(int rank, transport::Context& ctx)>& fn) {
  std::vector<std::unique_ptr<transport::Context>> ctxs;
  for (auto& p2p : transport::CreateLocalPointToPoints(size)) {
    ctxs.push_back(std::make_unique<transport::Context>(std::move(p2p), options));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r, *ctxs[r]); });
  for (std::thread& t : threads) t.join();
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TESTING_LOCAL_WORLD_H_
