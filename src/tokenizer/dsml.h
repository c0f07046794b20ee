// DeepSeek-V3.2's DSML tool calls, as generated after `<｜DSML｜function_calls>`:
//
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
//   ...
//   </｜DSML｜invoke>
//   ...
//   </｜DSML｜function_calls>
//
// parse_dsml_block() reads a block body as far as it goes (the streaming parser re-reads the growing body and
// sends what became certain); dsml_arguments() turns one invoke into OpenAI `arguments` JSON text. Both output
// parsers (whole and streaming) use them, so they agree. Rules and malformed input: docs/chat-formats.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/output_parser.h"

namespace megactx::chat {

// The tags a DSML block opens with: V3.2's `function_calls`, and `tool_calls` (DeepSeek-V4's name, which
// V3.2 checkpoints have been seen to write too).
inline constexpr std::string_view kDsmlBlockOpen = "<｜DSML｜function_calls>";
inline constexpr std::string_view kDsmlBlockOpenAlt = "<｜DSML｜tool_calls>";

struct DsmlParameter {
    std::string name;
    std::string string_attr;  // the `string` attribute: "true", "false", or "" when absent
    std::string value;        // raw text; for an open parameter, the part that can no longer change
    bool closed = false;
};

struct DsmlInvoke {
    std::string name;  // empty: the call is dropped
    std::vector<DsmlParameter> params;
    bool closed = false;
};

struct DsmlBlock {
    std::vector<DsmlInvoke> invokes;  // those whose `<｜DSML｜invoke …>` header is complete
    bool closed = false;              // the closing tag was read
    size_t end = 0;                   // closed: the offset in the body just after the closing tag
};

// `body` is the text after the opening tag. `final`: the output has ended, so whatever is open is closed at the
// end (an incomplete header is dropped). Otherwise the parse stops where more text could change its reading.
DsmlBlock parse_dsml_block(std::string_view body, bool final);

// The invoke's arguments as JSON object text, `{"k": v, ...}` (json.dumps style), when `complete`: parameters
// in order, a repeated name keeps its first value, the `arguments`/`input` wrapper repaired. Not complete: the
// prefix of that text that is already certain (possibly empty), so a stream can send it early.
std::string dsml_arguments(const DsmlInvoke& invoke, const ParserOptions& options, bool complete);

}  // namespace megactx::chat
