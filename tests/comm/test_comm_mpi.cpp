// Collectives in closed form: rank i contributes i + 1. Run under mpirun -np 2 and -np 4.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

#include "comm/together.h"
#include "core/dtype.h"
#include "core/error.h"
#include "mpi_world.h"

using namespace shardlm;
using shardlm::test::world;

TEST(Mpi, AllReduceSum) {
    MpiComm& c = world();
    const int n = c.size();
    std::vector<float> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(c.rank() + 1) * float(i);
    c.all_reduce_sum(v.data(), v.size());
    const float ranks = float(n * (n + 1) / 2);  // sum of (i + 1)
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], ranks * float(i));
}

TEST(Mpi, AllGatherAndBroadcast) {
    MpiComm& c = world();
    const int32_t mine[2] = {c.rank() + 1, -(c.rank() + 1)};
    std::vector<int32_t> all(size_t(2 * c.size()));
    c.all_gather(mine, sizeof mine, all.data());
    for (int r = 0; r < c.size(); ++r) {
        EXPECT_EQ(all[size_t(2 * r)], r + 1);
        EXPECT_EQ(all[size_t(2 * r + 1)], -(r + 1));
    }
    int64_t x = c.rank() == c.size() - 1 ? 4242 : 0;
    c.broadcast(&x, sizeof x, c.size() - 1);
    EXPECT_EQ(x, 4242);
}

// While rank 0 takes its time (a server waiting for requests), the others wait in
// broadcast_idle asleep: their thread's CPU time stays a small part of the wait.
TEST(Mpi, IdleBroadcastSleepsWhileItWaits) {
    MpiComm& c = world();
    c.barrier();
    auto thread_cpu = [] {
        timespec t{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
    };
    const auto wall0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu();
    if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    std::vector<int64_t> x(3, c.rank() == 0 ? 77 : 0);
    x[2] = c.rank() == 0 ? -5 : 0;
    c.broadcast_idle(x.data(), x.size() * sizeof(int64_t), 0);
    const double cpu = thread_cpu() - cpu0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    EXPECT_EQ(x, (std::vector<int64_t>{77, 77, -5}));
    if (c.rank() != 0) {
        EXPECT_GE(wall, 0.35);
        EXPECT_LT(cpu, 0.1 * wall) << "rank " << c.rank() << " spent " << cpu << " s of CPU in a " << wall << " s wait";
    }
    // Back to back, as in a busy serving loop: every call completes with the root's data.
    for (int64_t i = 0; i < 50; ++i) {
        int64_t y = c.rank() == 0 ? i : -1;
        c.broadcast_idle(&y, sizeof y, 0);
        ASSERT_EQ(y, i);
    }
}

TEST(Mpi, RunTogetherReportsTheFailingRankEverywhere) {
    MpiComm& c = world();
    const int bad = c.size() - 1;
    try {
        run_together(c, [&] {
            if (c.rank() == bad) fail("shard file broken on this rank");
        });
        FAIL() << "every rank must throw";
    } catch (const AgreedError& e) {
        EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(bad) + ": shard file broken on this rank");
    }
    EXPECT_NO_THROW(run_together(c, [] {}));
}

TEST(Mpi, CheckSameOnAllRanks) {
    MpiComm& c = world();
    EXPECT_NO_THROW(check_same_on_all_ranks(c, "same", "x"));
    EXPECT_THROW(check_same_on_all_ranks(c, c.rank() == 0 ? "a" : "b", "the model"), Error);
}

TEST(Mpi, AllReduceHalfPrecision) {
    MpiComm& c = world();
    std::vector<uint16_t> h(64), b(64);
    for (size_t i = 0; i < h.size(); ++i) {
        h[i] = f32_to_f16(float(c.rank() + 1) * 0.5f * float(i));
        b[i] = f32_to_bf16(float(c.rank() + 1) * 0.25f * float(i));
    }
    c.all_reduce_sum(h.data(), h.size(), DType::F16);
    c.all_reduce_sum(b.data(), b.size(), DType::BF16);
    const float ranks = float(c.size() * (c.size() + 1) / 2);
    for (size_t i = 0; i < h.size(); ++i) {
        EXPECT_EQ(f16_to_f32(h[i]), f16_to_f32(f32_to_f16(ranks * 0.5f * float(i))));
        EXPECT_EQ(bf16_to_f32(b[i]), bf16_to_f32(f32_to_bf16(ranks * 0.25f * float(i))));
    }
}
