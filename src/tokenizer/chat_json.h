// JSON text the way the chat formats need it: Python json.dumps style (", " and ": " separators, non-ASCII kept,
// floats as Python's repr), which is what the Hugging Face `tojson` filter and vLLM's tool parsers produce, plus
// the UTF-8 helpers the streaming parser needs. See docs/chat-formats.md.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace megactx::chat {

using Json = nlohmann::ordered_json;  // key order matters: templates and tool arguments keep insertion order

// json.dumps(v, ensure_ascii=False): `{"a": 1, "b": [true, null]}`.
std::string py_json_dumps(const Json& v);

// The body of a JSON string literal (no surrounding quotes), escaped like json.dumps(ensure_ascii=False):
// `"` `\` and control characters escaped, everything else kept. Invalid UTF-8 bytes become U+FFFD so the
// result is always valid UTF-8 and valid JSON.
void append_json_escaped(std::string& out, std::string_view s);

// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence that could still be completed
// by more bytes. Bytes of an already-invalid sequence count as complete (they never become valid).
size_t utf8_complete_prefix(std::string_view s);

// Python str.strip() with no argument: removes Unicode whitespace at both ends (UTF-8 input).
std::string_view py_strip(std::string_view s);

}  // namespace megactx::chat
