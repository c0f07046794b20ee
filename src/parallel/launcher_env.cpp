#include "parallel/launcher_env.h"

#include <charconv>

#include "core/error.h"

namespace megactx {

namespace {

constexpr int kDefaultPort = 29500;  // torch.distributed's MASTER_PORT default

int64_t integer_var(const std::function<const char*(const char*)>& getenv, const char* name, int64_t min, int64_t max) {
    const char* v = getenv(name);
    MEGACTX_CHECK(v != nullptr, "{} is not set", name);
    const std::string s(v);
    int64_t x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    MEGACTX_CHECK(ec == std::errc() && end == s.data() + s.size() && !s.empty(),
                  "the launcher's {}='{}' is not an integer", name, s);
    MEGACTX_CHECK(x >= min && x <= max, "the launcher's {}={} is outside {}..{}", name, x, min, max);
    return x;
}

bool is_set(const std::function<const char*(const char*)>& getenv, const char* name) {
    const char* v = getenv(name);
    return v != nullptr && *v != '\0';
}

// MASTER_ADDR / MASTER_PORT where set: node 0's address whatever the launcher.
void master_address(const std::function<const char*(const char*)>& getenv, LauncherEnv& e) {
    if (is_set(getenv, "MASTER_ADDR")) {
        e.host = getenv("MASTER_ADDR");
        e.variables += ", MASTER_ADDR";
    }
    if (is_set(getenv, "MASTER_PORT")) {
        e.port = static_cast<int>(integer_var(getenv, "MASTER_PORT", 1, 65535));
        e.variables += ", MASTER_PORT";
    }
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
    // The first entry ends at a comma outside brackets; a bracket holds ranges, of which the first number counts.
    std::string out;
    bool in_bracket = false, took_number = false;
    for (const char ch : nodelist) {
        if (!in_bracket && ch == ',') break;
        if (ch == '[') {
            in_bracket = true;
            took_number = false;
        } else if (ch == ']') {
            in_bracket = false;
        } else if (in_bracket) {
            if (!took_number && (ch == ',' || ch == '-')) took_number = true;
            if (!took_number) out += ch;
        } else {
            out += ch;
        }
    }
    MEGACTX_CHECK(!out.empty() && !in_bracket, "SLURM_JOB_NODELIST='{}' has no first host", nodelist);
    return out;
}

std::optional<LauncherEnv> launcher_env(const std::function<const char*(const char*)>& getenv) {
    LauncherEnv e;
    if (is_set(getenv, "LWS_GROUP_SIZE")) {
        e.launcher = "LeaderWorkerSet";
        e.variables = "LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS";
        e.nnodes = integer_var(getenv, "LWS_GROUP_SIZE", 1, 64);
        e.node_rank = integer_var(getenv, "LWS_WORKER_INDEX", 0, e.nnodes - 1);
        MEGACTX_CHECK(is_set(getenv, "LWS_LEADER_ADDRESS"), "LWS_LEADER_ADDRESS is not set");
        e.host = getenv("LWS_LEADER_ADDRESS");
    } else if (is_set(getenv, "MASTER_ADDR") && is_set(getenv, "WORLD_SIZE") && is_set(getenv, "RANK")) {
        e.launcher = "torchrun";
        e.variables = "WORLD_SIZE, RANK";
        if (is_set(getenv, "LOCAL_WORLD_SIZE")) {
            const int64_t local = integer_var(getenv, "LOCAL_WORLD_SIZE", 1, 1 << 20);
            MEGACTX_CHECK(local == 1,
                          "torchrun started {} processes on this node (LOCAL_WORLD_SIZE): megactx runs one process per "
                          "node (--nproc-per-node 1), whose ranks are its GPUs",
                          local);
        }
        e.nnodes = integer_var(getenv, "WORLD_SIZE", 1, 64);
        e.node_rank = integer_var(getenv, "RANK", 0, e.nnodes - 1);
    } else if (is_set(getenv, "SLURM_NNODES") && is_set(getenv, "SLURM_NODEID")) {
        e.launcher = "Slurm";
        e.variables = "SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST";
        e.nnodes = integer_var(getenv, "SLURM_NNODES", 1, 64);
        e.node_rank = integer_var(getenv, "SLURM_NODEID", 0, e.nnodes - 1);
        if (is_set(getenv, "SLURM_NTASKS_PER_NODE")) {
            MEGACTX_CHECK(std::string(getenv("SLURM_NTASKS_PER_NODE")) == "1",
                          "Slurm runs {} tasks per node (SLURM_NTASKS_PER_NODE): megactx runs one process per node "
                          "(srun --ntasks-per-node 1), whose ranks are its GPUs",
                          getenv("SLURM_NTASKS_PER_NODE"));
        }
        if (is_set(getenv, "SLURM_JOB_NODELIST")) e.host = first_slurm_host(getenv("SLURM_JOB_NODELIST"));
    } else if (is_set(getenv, "OMPI_COMM_WORLD_SIZE") && is_set(getenv, "OMPI_COMM_WORLD_RANK")) {
        e.launcher = "Open MPI";
        e.variables = "OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK";
        e.nnodes = integer_var(getenv, "OMPI_COMM_WORLD_SIZE", 1, 64);
        e.node_rank = integer_var(getenv, "OMPI_COMM_WORLD_RANK", 0, e.nnodes - 1);
    } else {
        return std::nullopt;
    }
    master_address(getenv, e);
    if (e.port == 0) e.port = kDefaultPort;
    return e;
}

}  // namespace megactx
