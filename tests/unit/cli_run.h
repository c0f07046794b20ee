// Runs the megactx binary (MEGACTX_BIN) through the shell with stdin from a string and stdout and stderr
// captured apart, for the tests of the streaming commands (run, eval).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "test_util.h"

namespace megactx::test {

struct CliResult {
    int exit_code = -1;  // -1: killed by a signal
    std::string out, err;
};

inline CliResult run_megactx(const TempDir& dir, const std::string& args, const std::string& stdin_text = "") {
    const std::string in = dir / "stdin.txt", out = dir / "stdout.txt", err = dir / "stderr.txt";
    write_text(in, stdin_text);
    const std::string cmd = std::string(MEGACTX_BIN) + " " + args + " < '" + in + "' > '" + out + "' 2> '" + err + "'";
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_text(out);
    r.err = read_text(err);
    return r;
}

// Single-quoted for the shell.
inline std::string shell_quoted(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

}  // namespace megactx::test
