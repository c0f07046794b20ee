// The multi-node flags from a launcher's environment (parallel/launcher_env.h): each launcher's variables, which
// one wins, node 0's address and port, and the errors that name a bad variable.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "parallel/launcher_env.h"
#include "test_util.h"

namespace megactx {
namespace {

using test::error_of;
using test::expect_contains;

std::optional<LauncherEnv> from(const std::map<std::string, std::string>& vars) {
    return launcher_env([&](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    });
}

std::string error_from(const std::map<std::string, std::string>& vars) {
    return error_of([&] { from(vars); });
}

TEST(LauncherEnv, NoneWithoutALaunchersVariables) {
    EXPECT_FALSE(from({}).has_value());
    EXPECT_FALSE(from({{"MASTER_ADDR", "10.0.0.1"}, {"PATH", "/usr/bin"}}).has_value());  // no node count
}

TEST(LauncherEnv, TorchrunOneProcessPerNode) {
    const auto e = from({{"MASTER_ADDR", "10.0.0.1"},
                         {"MASTER_PORT", "29600"},
                         {"WORLD_SIZE", "2"},
                         {"RANK", "1"},
                         {"LOCAL_WORLD_SIZE", "1"}});
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->launcher, "torchrun");
    EXPECT_EQ(e->nnodes, 2);
    EXPECT_EQ(e->node_rank, 1);
    EXPECT_EQ(e->host, "10.0.0.1");
    EXPECT_EQ(e->port, 29600);
    expect_contains(error_from({{"MASTER_ADDR", "h"}, {"WORLD_SIZE", "16"}, {"RANK", "3"}, {"LOCAL_WORLD_SIZE", "8"}}),
                    {"torchrun started 8 processes on this node (LOCAL_WORLD_SIZE)", "--nproc-per-node 1"});
    expect_contains(error_from({{"MASTER_ADDR", "h"}, {"WORLD_SIZE", "2"}, {"RANK", "2"}}), {"RANK=2 is outside 0..1"});
    expect_contains(error_from({{"MASTER_ADDR", "h"}, {"WORLD_SIZE", "two"}, {"RANK", "0"}}),
                    {"WORLD_SIZE='two' is not an integer"});
    expect_contains(error_from({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}}),
                    {"MASTER_PORT=70000 is outside 1..65535"});
}

TEST(LauncherEnv, LeaderWorkerSetWinsAndTakesTheDefaultPort) {
    const auto e = from({{"LWS_GROUP_SIZE", "4"},
                         {"LWS_WORKER_INDEX", "3"},
                         {"LWS_LEADER_ADDRESS", "leader.ns.svc"},
                         {"SLURM_NNODES", "2"},
                         {"SLURM_NODEID", "0"}});
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->launcher, "LeaderWorkerSet");
    EXPECT_EQ(e->nnodes, 4);
    EXPECT_EQ(e->node_rank, 3);
    EXPECT_EQ(e->host, "leader.ns.svc");
    EXPECT_EQ(e->port, 29500);
    expect_contains(error_from({{"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}}),
                    {"LWS_LEADER_ADDRESS is not set"});
}

TEST(LauncherEnv, SlurmTakesTheFirstHostOfTheNodeList) {
    const auto e = from({{"SLURM_NNODES", "3"},
                         {"SLURM_NODEID", "2"},
                         {"SLURM_JOB_NODELIST", "gpu[07-09]"},
                         {"SLURM_NTASKS_PER_NODE", "1"}});
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->launcher, "Slurm");
    EXPECT_EQ(e->nnodes, 3);
    EXPECT_EQ(e->node_rank, 2);
    EXPECT_EQ(e->host, "gpu07");
    // MASTER_ADDR / MASTER_PORT name node 0 where the job sets them.
    const auto m = from({{"SLURM_NNODES", "2"},
                         {"SLURM_NODEID", "0"},
                         {"SLURM_JOB_NODELIST", "a,b"},
                         {"MASTER_ADDR", "10.1.1.1"},
                         {"MASTER_PORT", "4000"}});
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->host, "10.1.1.1");
    EXPECT_EQ(m->port, 4000);
    expect_contains(error_from({{"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}, {"SLURM_NTASKS_PER_NODE", "8"}}),
                    {"Slurm runs 8 tasks per node", "--ntasks-per-node 1"});
    EXPECT_EQ(first_slurm_host("gpu[07-09,12],cpu3"), "gpu07");
    EXPECT_EQ(first_slurm_host("a,b"), "a");
    EXPECT_EQ(first_slurm_host("n[1-2]-ib"), "n1-ib");
    EXPECT_EQ(first_slurm_host("solo"), "solo");
    expect_contains(error_of([] { first_slurm_host("n[1-2"); }), {"has no first host"});
}

TEST(LauncherEnv, OpenMpiNeedsAnAddressFromElsewhere) {
    const auto e = from({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}});
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->launcher, "Open MPI");
    EXPECT_EQ(e->node_rank, 1);
    EXPECT_TRUE(e->host.empty());  // megactx then asks for --dist-init-addr or MASTER_ADDR
}

}  // namespace
}  // namespace megactx
