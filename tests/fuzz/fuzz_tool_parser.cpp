// libFuzzer target: the output parsers (GLM `<tool_call>` and DeepSeek-V3.2 DSML tool calls). The first two bytes pick the options and the chunking; the rest is the
// model output. The streaming parser (fed in those chunks) must reassemble exactly into parse_output()'s result,
// every tool call must start before its arguments, and every arguments string must be a JSON object.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/output_parser.h"

using megactx::chat::Json;
using megactx::chat::ParsedOutput;
using megactx::chat::ParserOptions;
using megactx::chat::StreamDelta;
using megactx::chat::StreamingOutputParser;

namespace {

void require(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 2) return 0;
    const uint8_t flags = data[0], chunking = data[1];
    const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

    ParserOptions opt;
    opt.start_in_reasoning = flags & 1;
    opt.parse_reasoning = !(flags & 2);
    opt.parse_tool_calls = !(flags & 4);
    if (flags & 8) opt.string_args["f"] = {"s", "path"};
    if (flags & 16) {  // DSML, with a known tool so the `arguments` wrapper repair is reached
        opt.tool_syntax = megactx::chat::ToolCallSyntax::kDsml;
        opt.tool_params["f"] = {{"s", "path"}, {"s"}};
        opt.string_args["f"] = {"s", "path"};
    }

    const ParsedOutput whole = megactx::chat::parse_output(text, opt);
    for (const auto& tc : whole.tool_calls) {
        require(!tc.name.empty());
        require(Json::parse(tc.arguments, nullptr, false).is_object());
    }

    ParsedOutput streamed;
    const auto take = [&](const std::vector<StreamDelta>& deltas) {
        for (const StreamDelta& d : deltas) {
            switch (d.kind) {
                case StreamDelta::Kind::kContent: streamed.content += d.text; break;
                case StreamDelta::Kind::kReasoning: streamed.reasoning += d.text; break;
                case StreamDelta::Kind::kToolCallBegin:
                    require(d.index == static_cast<int>(streamed.tool_calls.size()));
                    streamed.tool_calls.push_back({d.id, d.name, ""});
                    break;
                case StreamDelta::Kind::kToolCallArguments:
                    require(d.index + 1 == static_cast<int>(streamed.tool_calls.size()));
                    streamed.tool_calls.back().arguments += d.text;
                    break;
            }
        }
    };
    StreamingOutputParser parser(opt);
    // Chunk sizes cycle through 1..(chunking % 16 + 1), so one-byte feeding is always among the cases.
    const size_t max_chunk = chunking % 16 + 1;
    size_t pos = 0;
    for (size_t i = 0; pos < text.size(); ++i) {
        const size_t n = std::min(i % max_chunk + 1, text.size() - pos);
        take(parser.feed(text.substr(pos, n)));
        pos += n;
    }
    take(parser.finish());

    require(streamed.content == whole.content);
    require(streamed.reasoning == whole.reasoning);
    require(streamed.tool_calls.size() == whole.tool_calls.size());
    for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
        require(streamed.tool_calls[i].id == whole.tool_calls[i].id);
        require(streamed.tool_calls[i].name == whole.tool_calls[i].name);
        require(streamed.tool_calls[i].arguments == whole.tool_calls[i].arguments);
    }
    return 0;
}
