// vLLM's /tokenize and /detokenize, for any model served (no engine involved):
//   POST /tokenize   {"prompt": str, "add_special_tokens"?: true}                                    or
//                    {"messages": [...], "add_generation_prompt"?, "continue_final_message"?, "tools"?,
//                     "chat_template_kwargs"?, "add_special_tokens"?: false}  (the chat prompt exactly as
//                     /v1/chat/completions renders it), "return_token_strs"?: false
//                 → {"count", "max_model_len", "tokens", "token_strs"}   (token_strs null unless asked for)
//   POST /detokenize {"tokens": [int]} → {"prompt": text}
// Bad input is an ApiError 400 naming the field. docs/server.md.
#pragma once

#include <string>
#include <vector>

#include "server/request.h"
#include "tokenizer/chat_json.h"

namespace megactx {

chat::Json tokenize_request(const std::string& body, const RequestContext& ctx);

// `decodable`: which ids the tokenizer maps to text (decodable_ids); ids of the model's vocabulary beyond the
// tokenizer's decode to nothing, as in generation.
chat::Json detokenize_request(const std::string& body, const RequestContext& ctx, const std::vector<bool>& decodable);

}  // namespace megactx
