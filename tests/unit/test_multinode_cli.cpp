// Ranks as processes (--nnodes, design.md §6.4) through the real binary on a random tiny model, the nodes being
// processes of this machine meeting at 127.0.0.1: the output is byte for byte that of the same ranks as threads
// and of one process (greedy tokens, and the logits file bit for bit); faults end every node with an error that
// names the node or the field — a node that never arrives, a node started with other flags, a port in use, a
// node killed mid-run. Every process runs under a deadline, so a hang fails the test instead of stalling it.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "test_util.h"

extern char** environ;

namespace megactx {
namespace {

using test::CliResult;
using test::shell_quoted;
using Clock = std::chrono::steady_clock;

// A port nothing listens on now (the kernel's pick; free again once closed).
int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    return ntohs(a.sin_port);
}

// One megactx process in the background, its output in files.
class Node {
  public:
    // `env`: VAR=value words for this process alone.
    Node(const test::TempDir& dir, const std::string& name, const std::string& args, const std::string& env = "")
        : out_(dir / (name + ".out")), err_(dir / (name + ".err")) {
        // A file left by an earlier process of this name must not answer wait_for_err() before the shell has
        // truncated it.
        std::filesystem::remove(out_);
        std::filesystem::remove(err_);
        const std::string cmd = "exec env " + env + " " + std::string(MEGACTX_BIN) + " " + args + " < /dev/null > '" +
                                out_ + "' 2> '" + err_ + "'";
        const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
        EXPECT_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    }
    ~Node() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }
    // Waits for the exit (killing the process after `limit`, which fails the test).
    CliResult wait(std::chrono::seconds limit = std::chrono::seconds(120)) {
        CliResult r;
        const auto deadline = Clock::now() + limit;
        int status = 0;
        while (waitpid(pid_, &status, WNOHANG) == 0) {
            if (Clock::now() > deadline) {
                ADD_FAILURE() << "still running after " << limit.count() << " s: " << err_;
                kill(pid_, SIGKILL);
                waitpid(pid_, &status, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        pid_ = -1;
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.out = test::read_text(out_);
        r.err = test::read_text(err_);
        return r;
    }
    // Waits until stderr holds `text` (false after `limit`).
    bool wait_for_err(const std::string& text, std::chrono::seconds limit = std::chrono::seconds(60)) const {
        const auto deadline = Clock::now() + limit;
        while (Clock::now() < deadline) {
            if (test::read_text(err_).find(text) != std::string::npos) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }
    void kill_now() { kill(pid_, SIGKILL); }

  private:
    std::string out_, err_;
    pid_t pid_ = -1;
};

class MultiNode : public ::testing::Test {
  protected:
    void SetUp() override {
        model_ = dir_ / "model";
        const CliResult r = test::run_megactx(dir_, "gen-model --preset tiny --seed 0 --out " + shell_quoted(model_));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        port_ = free_port();
    }
    std::string addr() const { return "--dist-init-addr 127.0.0.1:" + std::to_string(port_); }
    std::string nodes(int64_t n, int64_t rank) const {
        return addr() + " --nnodes " + std::to_string(n) + " --node-rank " + std::to_string(rank);
    }
    CliResult run(const std::string& args) { return test::run_megactx(dir_, args); }

    // The same command on `n` nodes; node 0's result (the others must end with status 0 and no output).
    CliResult on_nodes(int64_t n, const std::string& args, const std::string& extra = "") {
        std::vector<std::unique_ptr<Node>> ps;
        for (int64_t k = n - 1; k >= 0; --k)  // the followers first: they retry until node 0 listens
            ps.push_back(std::make_unique<Node>(dir_, "node" + std::to_string(k),
                                                args + " " + nodes(n, k) + " --dist-timeout 60 " + extra));
        const CliResult lead = ps.back()->wait();
        for (int64_t k = 0; k + 1 < n; ++k) {
            const CliResult f = ps[static_cast<size_t>(k)]->wait();
            EXPECT_EQ(f.exit_code, 0) << f.err;
            EXPECT_EQ(f.out, "");
        }
        return lead;
    }

    // One error line naming `part`, status 1.
    static void expect_error(const CliResult& r, const std::string& part) {
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_NE(r.err.find("megactx: error: "), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(part), std::string::npos) << "'" << part << "' not in: " << r.err;
    }

    test::TempDir dir_;
    std::string model_;
    int port_ = 0;
};

TEST_F(MultiNode, RunGivesTheThreadsAndTheOneProcessOutput) {
    const std::string cmd =
        "run --model " + shell_quoted(model_) + " -p 'Hello there' --no-think --temperature 0 -n 24 -q";
    const CliResult one = run(cmd);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    ASSERT_GT(one.out.size(), 10u);
    const CliResult threads = run(cmd + " --tp 2");
    ASSERT_EQ(threads.exit_code, 0) << threads.err;
    EXPECT_EQ(threads.out, one.out);
    const CliResult two = on_nodes(2, cmd + " --tp 2");
    ASSERT_EQ(two.exit_code, 0) << two.err;
    EXPECT_EQ(two.out, one.out);
    // Two ranks a node (threads within a node, gloo between them), experts split and the KV by layers (its
    // broadcasts cross the processes).
    const CliResult four = on_nodes(2, cmd + " --tp 4 --expert-parallel --layer-split");
    ASSERT_EQ(four.exit_code, 0) << four.err;
    EXPECT_EQ(four.out, one.out);
}

TEST_F(MultiNode, LogitsAreTheThreadsBitForBit) {
    const std::string cmd = "logits --model " + shell_quoted(model_) + " --tokens 3,1,4,1,5,9,2,6 --chunk 3 --tp 2";
    const CliResult threads = run(cmd + " --indexer-split --out " + shell_quoted(dir_ / "threads.npy"));
    ASSERT_EQ(threads.exit_code, 0) << threads.err;
    const CliResult nodes2 = on_nodes(2, cmd + " --indexer-split", "--out " + shell_quoted(dir_ / "nodes.npy"));
    ASSERT_EQ(nodes2.exit_code, 0) << nodes2.err;
    const std::vector<uint8_t> a = test::read_bytes(dir_ / "threads.npy"), b = test::read_bytes(dir_ / "nodes.npy");
    ASSERT_GT(a.size(), 1000u);
    EXPECT_TRUE(a == b) << "the logits of two processes differ from those of two threads";
}

// Pipeline stages across processes (issue 53): whole stages a node (their tensor-parallel ranks threads inside it),
// the hidden states and the logits crossing between nodes over gloo. One stage a node, two stages a node (their
// pipes still over gloo) and PP 2 × TP 2 give the logits of one process (of the TP 2 threads for TP 2) bit for bit,
// and `run` gives one process's text.
TEST_F(MultiNode, PipelineStagesOnNodesGiveTheOneProcessResults) {
    const std::string cmd = "logits --model " + shell_quoted(model_) + " --tokens 3,1,4,1,5,9,2,6,5,3 --chunk 4";
    const auto out = [&](const std::string& name) { return "--out " + shell_quoted(dir_ / name); };
    ASSERT_EQ(run(cmd + " " + out("one.npy")).exit_code, 0);
    ASSERT_EQ(run(cmd + " --tp 2 " + out("tp2.npy")).exit_code, 0);
    const std::vector<uint8_t> one = test::read_bytes(dir_ / "one.npy"), tp2 = test::read_bytes(dir_ / "tp2.npy");
    ASSERT_GT(one.size(), 1000u);
    for (const auto& [flags, want] : {std::pair<std::string, const std::vector<uint8_t>*>{"--pp 2", &one},
                                      {"--pp 4", &one},
                                      {"--pp 2 --tp 2", &tp2}}) {
        SCOPED_TRACE(flags);
        const CliResult r = on_nodes(2, cmd + " " + flags, out("nodes.npy"));
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_TRUE(test::read_bytes(dir_ / "nodes.npy") == *want) << "the logits differ from one process's";
    }
    const std::string text =
        "run --model " + shell_quoted(model_) + " -p 'Hello there' --no-think --temperature 0 -n 24 -q";
    const CliResult single = run(text);
    ASSERT_EQ(single.exit_code, 0) << single.err;
    const CliResult staged = on_nodes(2, text + " --pp 2");
    ASSERT_EQ(staged.exit_code, 0) << staged.err;
    EXPECT_EQ(staged.out, single.out);
}

TEST_F(MultiNode, PipelineFlagsThatCannotWorkAreClearErrors) {
    const std::string gen = "generate --model " + shell_quoted(model_) + " --tokens 1,2,3 ";
    expect_error(run(gen + "--pp 3 --nnodes 2 " + addr()),
                 "--pipeline-parallel-size 3 with --nnodes 2: every node runs the same number of whole stages");
    expect_error(run(gen + "--pp 9"), "--pipeline-parallel-size must be 1..6");  // 6 layers
}

// MTP speculative decoding: the draft steps' inputs (rank 0's hidden states, the reused top-k) reach the other
// node with the batch; the tokens are one process's.
TEST_F(MultiNode, SpeculativeDecodingGivesTheOneProcessTokens) {
    const std::string gen =
        "generate --model " + shell_quoted(model_) + " --tokens 1,2,3,4,5 --max-new-tokens 12 --speculative-tokens 2";
    const CliResult one = run(gen);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    ASSERT_NE(one.err.find("MTP drafts"), std::string::npos) << one.err;
    const CliResult two = on_nodes(2, gen + " --tp 2");
    ASSERT_EQ(two.exit_code, 0) << two.err;
    EXPECT_EQ(two.out, one.out);
    // a stage a node: the MTP layer on node 1, its inputs and results crossing with each draft step
    const CliResult staged = on_nodes(2, gen + " --pp 2");
    ASSERT_EQ(staged.exit_code, 0) << staged.err;
    EXPECT_EQ(staged.out, one.out);
}

// What does not cross processes yet is refused at startup, and the other node is stopped.
TEST_F(MultiNode, AHostKvTierIsRefused) {
    const CliResult r =
        on_nodes(2, "generate --model " + shell_quoted(model_) + " --tokens 1,2,3 --tp 2 --kv-offload-memory 1MiB");
    expect_error(r, "--kv-offload-memory: a host KV tier with ranks on several nodes is not supported");
}

TEST_F(MultiNode, BadFlagCombinationsAreClearErrors) {
    const std::string gen = "generate --model " + shell_quoted(model_) + " --tokens 1,2,3 ";
    expect_error(run(gen + "--tp 2 --nnodes 2 --node-rank 2 " + addr()), "--node-rank 2 with --nnodes 2: must be 0..1");
    expect_error(run(gen + "--tp 2 --nnodes 2"), "--nnodes 2 needs node 0's address: --dist-init-addr HOST:PORT");
    expect_error(run(gen + "--tp 3 --nnodes 2 " + addr()),
                 "--tensor-parallel-size 3 with --nnodes 2: every node runs the same number of ranks");
    expect_error(run(gen + "--nnodes 2 " + addr()), "--tensor-parallel-size 1 with --nnodes 2");
    expect_error(run(gen + "--tp 2 --node-rank 1"), "--node-rank 1 with --nnodes 1");
    expect_error(run(gen + "--tp 2 --nnodes 2 --dist-init-addr localhost"), "--dist-init-addr must be HOST:PORT");
    expect_error(run(gen + "--tp 2 --nnodes 2 --dist-init-addr h:99999"), "port must be a number in 1..65535");
    expect_error(run(gen + "--tp 2 --nnodes 2 --master-addr 127.0.0.1 " + addr()),
                 "--dist-init-addr and --master-addr/--master-port name the same address");
    expect_error(run(gen + "--tp 2 --nnodes 2 --headless " + addr()), "--headless with --node-rank 0");
    expect_error(run(gen + "--tp 2 --nnodes 2 --tp-transport thread " + addr()),
                 "--tp-transport thread with --nnodes 2");
    expect_error(run(gen + "--tp 2 --tp-transport gloo"), "--tp-transport gloo is for ranks in several processes");
}

// vLLM's --master-addr / --master-port name node 0 as --dist-init-addr does.
TEST_F(MultiNode, MasterAddrAndPortAreAnAlias) {
    const std::string gen =
        "generate --model " + shell_quoted(model_) + " --tokens 1,2,3,4,5 --max-new-tokens 8 --tp 2";
    const CliResult one = run(gen);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const std::string vllm = " --master-addr 127.0.0.1 --master-port " + std::to_string(port_) + " --nnodes 2";
    Node follower(dir_, "f", gen + vllm + " --node-rank 1 --headless --dist-timeout 60");
    Node lead(dir_, "l", gen + vllm + " --node-rank 0 --dist-timeout 60");
    const CliResult r = lead.wait();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, one.out);
    EXPECT_EQ(follower.wait().exit_code, 0);
}

// Without the flags, a launcher's environment names the nodes (here torchrun's, one process per node; Slurm's, with
// node 0 from the node list, and a torchrun that starts a process per GPU is refused).
TEST_F(MultiNode, ALaunchersEnvironmentGivesTheFlags) {
    const std::string gen =
        "generate --model " + shell_quoted(model_) + " --tokens 1,2,3,4,5 --max-new-tokens 8 --tp 2";
    const CliResult one = run(gen);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const std::string torch = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port_) + " WORLD_SIZE=2 RANK=";
    Node follower(dir_, "f", gen + " --dist-timeout 60", torch + "1");
    Node lead(dir_, "l", gen + " --dist-timeout 60", torch + "0");
    const CliResult r = lead.wait();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, one.out);
    EXPECT_NE(r.err.find("--nnodes 2 --node-rank 0 --dist-init-addr 127.0.0.1:" + std::to_string(port_) +
                         " from torchrun"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(follower.wait().exit_code, 0);

    const std::string slurm = "SLURM_NNODES=2 SLURM_JOB_NODELIST=127.0.0.1 MASTER_PORT=" + std::to_string(port_) +
                              " SLURM_NODEID=";
    Node f2(dir_, "f2", gen + " --dist-timeout 60", slurm + "1");
    Node l2(dir_, "l2", gen + " --dist-timeout 60", slurm + "0");
    const CliResult r2 = l2.wait();
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    EXPECT_EQ(r2.out, one.out);
    EXPECT_EQ(f2.wait().exit_code, 0);

    Node many(dir_, "m", gen, "MASTER_ADDR=127.0.0.1 WORLD_SIZE=16 RANK=0 LOCAL_WORLD_SIZE=8");
    expect_error(many.wait(), "torchrun started 8 processes on this node");
}

// Something else connecting to node 0's port (a scanner, an HTTP client) is dropped; the real node still joins.
TEST_F(MultiNode, AStrayConnectionIsIgnored) {
    const std::string gen =
        "generate --model " + shell_quoted(model_) + " --tokens 1,2,3,4,5 --max-new-tokens 8 --tp 2";
    const CliResult one = run(gen);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    Node lead(dir_, "l", gen + " --dist-timeout 60 " + nodes(2, 0));
    ASSERT_TRUE(lead.wait_for_err("waiting for the other nodes"));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    for (int i = 0; i < 100 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string http = "GET / HTTP/1.0\r\n\r\n";
    ASSERT_EQ(write(fd, http.data(), http.size()), static_cast<ssize_t>(http.size()));
    close(fd);
    Node follower(dir_, "f", gen + " --dist-timeout 60 " + nodes(2, 1));
    const CliResult r = lead.wait();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, one.out);
    EXPECT_EQ(follower.wait().exit_code, 0);
}

TEST_F(MultiNode, AMissingNodeIsAnErrorAtTheTimeout) {
    const std::string gen = "generate --model " + shell_quoted(model_) + " --tokens 1,2,3 --tp 2 --dist-timeout 1 ";
    expect_error(run(gen + nodes(2, 0)),
                 "--dist-timeout 1 s: node 1 did not reach node 0 at 127.0.0.1:" + std::to_string(port_));
    expect_error(run(gen + nodes(2, 1)),
                 "--dist-timeout 1 s: node 1 could not reach node 0 at 127.0.0.1:" + std::to_string(port_));
}

TEST_F(MultiNode, OtherFlagsOnANodeAreAnErrorOnBoth) {
    const std::string gen = "generate --model " + shell_quoted(model_) + " --tokens 1,2,3 --tp 2 --dist-timeout 60 ";
    Node follower(dir_, "f", gen + nodes(2, 1) + " --layer-split");
    Node lead(dir_, "l", gen + nodes(2, 0));
    const std::string why = "node 1 does not match node 0: --layer-split differs: on on node 1, off on node 0";
    expect_error(lead.wait(), why);
    expect_error(follower.wait(), why);
}

// A node whose shard does not load (its checkpoint damaged, the same size): node 0 ends with that node's error.
TEST_F(MultiNode, ANodesLoadErrorReachesNodeZero) {
    const std::string broken = dir_ / "broken";
    std::filesystem::copy(model_, broken);
    const std::string file = broken + "/model.safetensors";
    std::vector<uint8_t> bytes = test::read_bytes(file);
    ASSERT_GT(bytes.size(), 9u);
    ASSERT_EQ(bytes[8], '{');
    bytes[8] = 'X';  // the header is no longer JSON
    test::write_bytes(file, bytes);
    const std::string gen = "generate --tokens 1,2,3 --tp 2 --dist-timeout 60 ";
    Node follower(dir_, "f", gen + "--model " + shell_quoted(broken) + " " + nodes(2, 1));
    Node lead(dir_, "l", gen + "--model " + shell_quoted(model_) + " " + nodes(2, 0));
    const CliResult f = follower.wait(), l = lead.wait();
    expect_error(f, "model.safetensors");
    expect_error(l, "tensor parallel: node 1 (rank 1): ");
    EXPECT_NE(l.err.find("model.safetensors"), std::string::npos) << l.err;
}

TEST_F(MultiNode, APortInUseIsAnError) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    expect_error(
        run("generate --model " + shell_quoted(model_) + " --tokens 1,2,3 --tp 2 --dist-timeout 5 " + nodes(2, 0)),
        "--dist-init-addr 127.0.0.1:" + std::to_string(port_) + ": node 0 cannot listen: port " +
            std::to_string(port_) + " is already in use");
    close(fd);
}

// Node 0's engine failing between steps (the engine's fault hook): node 0 ends with that error and the other
// node, told to stop, ends with status 0 instead of waiting for steps that will not come.
TEST_F(MultiNode, NodeZerosErrorStopsTheOthers) {
    const std::string cmd =
        "run --model " + shell_quoted(model_) + " -p 'Hello' --no-think -n 24 -q --tp 2 " + "--dist-timeout 60 ";
    Node follower(dir_, "f", cmd + nodes(2, 1));
    Node lead(dir_, "l", cmd + nodes(2, 0), "MEGACTX_FAULT_STEP=3");
    expect_error(lead.wait(), "fault injected at engine step 3");
    const CliResult f = follower.wait();
    EXPECT_EQ(f.exit_code, 0) << f.err;
}

// A rank failing inside a forward, its peers waiting in a collective: the debug taps' directory cannot be made
// (MEGACTX_TAP_DIR under a plain file), on one node only. Node 0 failing releases the other node, which says
// so; the other node failing reaches node 0 as its error, naming it. Two ranks a node, so threads of the same
// process wait in the collective too.
TEST_F(MultiNode, AFailureMidStepOnEitherNodeEndsBoth) {
    test::write_text(dir_ / "plain", "");
    const std::string taps = "MEGACTX_TAP_DIR=" + dir_ / "plain" + "/taps";
    const std::string gen = "generate --model " + shell_quoted(model_) + " --tokens 1,2,3 --tp 4 --dist-timeout 60 ";
    {
        Node follower(dir_, "f1", gen + nodes(2, 1));
        Node lead(dir_, "l1", gen + nodes(2, 0), taps);
        expect_error(lead.wait(), "cannot create directories");
        expect_error(follower.wait(), "tensor parallel: node 0 aborted the step");
    }
    port_ = free_port();
    {
        Node follower(dir_, "f2", gen + nodes(2, 1), taps);
        Node lead(dir_, "l2", gen + nodes(2, 0));
        const CliResult l = lead.wait();
        expect_error(l, "tensor parallel: node 1 (ranks 2-3): ");
        EXPECT_NE(l.err.find("cannot create directories"), std::string::npos) << l.err;
        expect_error(follower.wait(), "cannot create directories");
    }
}

// A node killed mid-run: the other ends with an error naming it, within seconds (Node::wait's limit fails a
// hang), whichever side dies; with the node a tensor-parallel rank and with it a pipeline stage.
TEST_F(MultiNode, ANodeKilledMidRunStopsTheOther) {
    for (const std::string split : {"--tp 2", "--pp 2"}) {
        SCOPED_TRACE(split);
        const std::string gen = "generate --model " + shell_quoted(model_) +
                                " --tokens 1,2,3 --max-new-tokens 20000 --ignore-eos --dist-timeout 60 " + split + " ";
        port_ = free_port();
        {
            Node follower(dir_, "f1", gen + nodes(2, 1));
            Node lead(dir_, "l1", gen + nodes(2, 0));
            ASSERT_TRUE(follower.wait_for_err("node 1 ready"));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));  // node 0 is generating
            follower.kill_now();
            expect_error(lead.wait(std::chrono::seconds(30)), "tensor parallel: node 1 (rank 1) exited");
        }
        port_ = free_port();
        {
            Node follower(dir_, "f2", gen + nodes(2, 1));
            Node lead(dir_, "l2", gen + nodes(2, 0));
            ASSERT_TRUE(follower.wait_for_err("node 1 ready"));
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            lead.kill_now();
            expect_error(follower.wait(std::chrono::seconds(30)), "tensor parallel: node 0 (rank 0) exited");
        }
    }
}

}  // namespace
}  // namespace megactx
