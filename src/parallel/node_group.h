// Node 0 drives the ranks of the other nodes (issue 53; design.md §6.4). Each step TensorParallelGroup sends
// the forward's inputs — the Batch (tokens, positions, block tables, logit rows), the KV pool's shape, the MTP
// inputs — to every other node over its control connection; each node runs its ranks' part of the forward
// (their collectives meet node 0's over gloo) and answers done or its error. Faults end every process with an
// error that names the node: a node whose connection closes without an answer (it died) makes the others exit
// within the time the kernel takes to close its sockets; node 0 aborting a step (its own error) makes the
// others exit; a node's error is rethrown on node 0 as "node k (ranks …): …".
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_format.h"
#include "model/glm_dsa.h"
#include "parallel/rendezvous.h"

namespace megactx {

class TensorParallelGroup;

// The KV pool every rank makes like rank 0's (no host tier across processes).
struct KvShape {
    int64_t n_blocks = 0;
    KvFormat format = KvFormat::F32;
};

// A step's message body: the KV shape, then (forwards) the batch, then (MTP forwards) the MTP inputs.
std::string encode_step(const KvShape& kv, const Batch* batch, const RankFollowers::MtpInputs* mtp);

// "rank 2" or "ranks 2–3": the global ranks of `node` with `per_node` ranks a node.
std::string node_ranks_text(int64_t node, int64_t per_node);

// Node 0's side: one reader thread per other node collects its answers.
class FollowerNodes {
  public:
    FollowerNodes(std::unique_ptr<Rendezvous> rv, int64_t ranks_per_node);
    ~FollowerNodes();  // tells every node to stop (they exit 0)
    FollowerNodes(const FollowerNodes&) = delete;
    FollowerNodes& operator=(const FollowerNodes&) = delete;

    // Sends a step to every node; each answers once.
    void send(uint32_t type, const std::string& body);
    // Waits for every node's answer to the last step; throws the first node's error, naming it.
    void wait();
    // Node 0 failed mid-step: every node leaves its collectives and exits. Returns true when a node had failed
    // first (wait() then throws its error).
    bool abort();

  private:
    void read_loop(int64_t node);
    void send_all(uint32_t type, const std::string& body);  // to every node still there
    bool all_settled() const;                               // every node answered the last step or closed (mu_ held)
    // A node that closed mid-step without an error or acknowledging an abort: it died (mu_ held; -1: none).
    int64_t died() const;

    std::unique_ptr<Rendezvous> rv_;
    int64_t per_node_;
    std::vector<std::thread> readers_;
    std::mutex mu_;
    std::condition_variable cv_;
    int64_t sent_ = 0;                // steps sent
    std::vector<int64_t> answered_;   // per node: steps answered
    std::vector<bool> closed_;        // per node: its connection ended
    std::vector<bool> acked_;         // per node: it acknowledged node 0's abort (else a close mid-step = it died)
    std::vector<std::string> error_;  // per node: its error, if any
    bool stopping_ = false, aborting_ = false;
    int64_t aborted_step_ = -1;  // the step during which node 0 aborted
};

// A node other than 0: runs `group`'s ranks for node 0's steps until node 0 stops them (returns 0); on an error
// it prints it, tells node 0 and ends the process (status 1). `rv` is the rendezvous that made the group's
// communicators.
int run_follower_node(Rendezvous& rv, TensorParallelGroup& group);

}  // namespace megactx
