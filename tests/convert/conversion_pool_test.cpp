// Concurrency tests; CI also runs them under ThreadSanitizer (scripts/test.sh).
#include "activekv/convert/conversion_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>

#include "activekv/core/error.h"

namespace activekv {
namespace {

TEST(ConversionPool, RunsEveryJobAndWaitsPerOwner) {
  convert::ConversionPool pool(2);
  std::atomic<int> a{0}, b{0};
  int owner_a = 0, owner_b = 0;
  for (int i = 0; i < 200; ++i) {
    pool.submit(&owner_a, [&] { a++; });
    pool.submit(&owner_b, [&] { b++; });
  }
  pool.wait(&owner_a);
  EXPECT_EQ(a.load(), 200);
  pool.wait(&owner_b);
  EXPECT_EQ(b.load(), 200);
  EXPECT_EQ(pool.completed(), 400u);
}

TEST(ConversionPool, FailedJobIsLoggedAndCounted) {
  std::vector<std::string> lines;
  std::mutex mu;
  convert::ConversionPool pool(1, [&](const std::string& l) {
    std::lock_guard lock(mu);
    lines.push_back(l);
  });
  int owner = 0;
  pool.submit(&owner, [] { throw Error("checksum mismatch in page 7"); });
  pool.submit(&owner, [] {});
  pool.wait(&owner);
  EXPECT_EQ(pool.failed(), 1u);
  EXPECT_EQ(pool.completed(), 1u);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("page 7"), std::string::npos);
}

TEST(ConversionPool, CancelDropsQueuedJobsAndWaitsForRunning) {
  convert::ConversionPool pool(1);
  std::atomic<bool> started{false}, release{false};
  std::atomic<int> ran{0};
  int owner = 0;
  pool.submit(&owner, [&] {
    started = true;
    while (!release) std::this_thread::yield();
    ran++;
  });
  for (int i = 0; i < 50; ++i) pool.submit(&owner, [&] { ran++; });
  while (!started) std::this_thread::yield();  // the first job is running, the rest queued
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    release = true;
  });
  pool.cancel(&owner);  // returns only once the running job finished
  t.join();
  EXPECT_GE(ran.load(), 1);   // cancel waited for the running job
  EXPECT_LT(ran.load(), 51);  // and dropped queued ones (200 ms is ample for cancel to take the lock)
}

TEST(ConversionPool, DestructorDrainsQueuedJobs) {
  std::atomic<int> n{0};
  {
    convert::ConversionPool pool(2);
    int owner = 0;
    for (int i = 0; i < 100; ++i) pool.submit(&owner, [&] { n++; });
  }
  EXPECT_EQ(n.load(), 100);
}

TEST(ConversionPool, RejectsZeroThreads) { EXPECT_THROW(convert::ConversionPool(0), InvalidArgument); }

}  // namespace
}  // namespace activekv
