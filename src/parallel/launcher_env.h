// The node count, this node's rank and node 0's address as a job launcher's environment gives them, for the
// multi-node flags (--nnodes, --node-rank, --dist-init-addr) when the command line has none (issue 53). One
// megactx process per node, as the flags assume:
//   torchrun / torch.distributed (--nproc-per-node 1): WORLD_SIZE nodes, RANK, MASTER_ADDR / MASTER_PORT;
//   LeaderWorkerSet (Kubernetes): LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS;
//   Slurm (srun, one task per node): SLURM_NNODES, SLURM_NODEID, node 0 = the first host of SLURM_JOB_NODELIST;
//   Open MPI (mpirun --map-by ppr:1:node): OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK.
// MASTER_ADDR / MASTER_PORT, where set, name node 0's address for every launcher; the port is otherwise 29500
// (torch's default). Only the environment is read: nothing here opens a socket.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace megactx {

struct LauncherEnv {
    std::string launcher;   // "torchrun", "LeaderWorkerSet", "Slurm", "Open MPI"
    std::string variables;  // the variables read, for the log line
    int64_t nnodes = 1;
    int64_t node_rank = 0;
    std::string host;  // node 0; empty when the launcher does not say it (Open MPI without MASTER_ADDR)
    int port = 0;
};

// The first launcher whose variables are set (in the order above), or nothing. `getenv` returns a variable's
// value or nullptr. Malformed values (a rank outside the node count, a non-number) are an error naming the variable.
std::optional<LauncherEnv> launcher_env(const std::function<const char*(const char*)>& getenv);

// The first host of a Slurm node list: "gpu[07-09,12],cpu3" → "gpu07", "a,b" → "a", "n[1-2]-ib" → "n1-ib".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace megactx
