// Shared checks of the output parsers' streaming contract: streamed deltas reassembled in the OpenAI shape,
// compared with parse_output() on the whole text.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/output_parser.h"

namespace megactx::chat {

// Reassembles streamed deltas, checking the OpenAI streaming shape on the way.
inline ParsedOutput reassemble(const std::vector<StreamDelta>& deltas) {
    ParsedOutput r;
    for (const StreamDelta& d : deltas) {
        switch (d.kind) {
            case StreamDelta::Kind::kContent:
                r.content += d.text;
                break;
            case StreamDelta::Kind::kReasoning:
                r.reasoning += d.text;
                break;
            case StreamDelta::Kind::kToolCallBegin:
                EXPECT_EQ(d.index, static_cast<int>(r.tool_calls.size())) << "tool calls start in index order";
                EXPECT_TRUE(d.text.empty());
                r.tool_calls.push_back({d.id, d.name, ""});
                break;
            case StreamDelta::Kind::kToolCallArguments:
                EXPECT_EQ(d.index + 1, static_cast<int>(r.tool_calls.size())) << "arguments only for the open call";
                if (!r.tool_calls.empty()) r.tool_calls.back().arguments += d.text;
                break;
        }
        if (d.kind != StreamDelta::Kind::kToolCallBegin) {
            EXPECT_FALSE(d.text.empty()) << "no empty deltas";
        }
    }
    return r;
}

inline bool valid_utf8(const std::string& s) {
    try {
        (void)Json(s).dump();
        return true;
    } catch (const Json::exception&) {
        return false;
    }
}

inline void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& where) {
    EXPECT_EQ(a.content, b.content) << where;
    EXPECT_EQ(a.reasoning, b.reasoning) << where;
    ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << where;
    for (size_t i = 0; i < a.tool_calls.size(); ++i) {
        EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << where;
        EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << where;
        EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << where;
    }
}

// Streams `text` in chunks of the given sizes (cycled) and checks the result against parse_output().
inline void check_streaming(std::string_view text, const ParserOptions& opt, const std::vector<size_t>& sizes,
                            bool input_is_utf8) {
    const ParsedOutput whole = parse_output(text, opt);
    for (const auto& tc : whole.tool_calls) {
        const Json args = Json::parse(tc.arguments, nullptr, false);
        EXPECT_TRUE(args.is_object()) << "arguments must be a JSON object: " << tc.arguments;
    }
    StreamingOutputParser p(opt);
    std::vector<StreamDelta> all;
    size_t pos = 0;
    for (size_t i = 0; pos < text.size(); ++i) {
        const size_t n = std::min(sizes[i % sizes.size()], text.size() - pos);
        for (auto& d : p.feed(text.substr(pos, n))) all.push_back(std::move(d));
        pos += n;
    }
    for (auto& d : p.finish()) all.push_back(std::move(d));
    for (const auto& d : all) {
        if (input_is_utf8) {
            EXPECT_TRUE(valid_utf8(d.text)) << "delta splits a UTF-8 character";
        }
    }
    expect_same(reassemble(all), whole, std::string(text));
}

}  // namespace megactx::chat
