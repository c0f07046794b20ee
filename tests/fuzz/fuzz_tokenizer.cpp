// libFuzzer target for the tokenizer: encode arbitrary bytes and decode arbitrary ids with small built-in
// tokenizers. Checks, besides "no crash": decode(encode(x)) equals x with invalid UTF-8 replaced (for the
// tokenizer without a normalizer), and streamed decoding equals decode.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

std::string tokenizer_json(bool nfc) {
    std::string vocab;
    const auto& bytes = megactx::utf8::byte_to_unicode();
    auto quote = [](const std::string& s) {
        std::string q = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') q += '\\';
            q += c;
        }
        return q + "\"";
    };
    for (int b = 0; b < 256; ++b) vocab += quote(bytes[b]) + ":" + std::to_string(b) + ",";
    vocab += "\"th\":256,\"the\":257,\"\xC4\xA0" "the\":258,\"in\":259,\"\xC4\xA0t\":260";
    return std::string(R"({"normalizer":)") + (nfc ? R"({"type":"NFC"})" : "null") +
           R"(,"pre_tokenizer":{"type":"Sequence","pretokenizers":[
             {"type":"Split","pattern":{"Regex":"(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},
             {"type":"Digits","individual_digits":true},
             {"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
           "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
             "special_tokens":{"<s>":{"id":"<s>","ids":[261],"tokens":["<s>"]}}},
           "decoder":{"type":"ByteLevel"},
           "added_tokens":[
             {"id":261,"content":"<s>","special":true,"lstrip":false,"rstrip":false,"single_word":false,"normalized":false},
             {"id":262,"content":"<|user|>","special":true,"lstrip":true,"rstrip":true,"single_word":false,"normalized":false},
             {"id":263,"content":"word","special":false,"lstrip":false,"rstrip":false,"single_word":true,"normalized":true},
             {"id":264,"content":"\u00e9t\u00e9","special":false,"lstrip":false,"rstrip":false,"single_word":false,"normalized":true}],
           "model":{"type":"BPE","vocab":{)" +
           vocab + R"(},"merges":["t h","th e","Ġ t","Ġ the","i n"]}})";
}

const megactx::Tokenizer& plain() {
    static const megactx::Tokenizer t = megactx::Tokenizer::from_json(tokenizer_json(false), {}, "fuzz");
    return t;
}
const megactx::Tokenizer& normalized() {
    static const megactx::Tokenizer t = megactx::Tokenizer::from_json(tokenizer_json(true), {}, "fuzz");
    return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const uint8_t mode = data[0] % 3;
    const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
    if (mode == 0 || mode == 1) {
        const megactx::Tokenizer& tok = mode == 0 ? plain() : normalized();
        const std::vector<int32_t> ids = tok.encode(input, data[0] & 4);
        const std::string text = tok.decode(ids, false);
        if (mode == 0) {
            std::string expect;
            megactx::utf8::append_lossy(expect, input);
            // lstrip/rstrip on <|user|> drop whitespace, so only inputs without it must round-trip exactly.
            if (data[0] & 4) expect = "<s>" + expect;  // the template's BOS
            if (expect.find("<|user|>") == std::string::npos && text != expect) __builtin_trap();
        }
        return 0;
    }
    // Decode arbitrary ids (some out of range).
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 2 <= input.size(); i += 2) {
        uint16_t v;
        std::memcpy(&v, input.data() + i, 2);
        ids.push_back(static_cast<int32_t>(v % 280) - 4);
    }
    const megactx::Tokenizer& tok = plain();
    const bool skip = (data[0] / 3) % 2 == 1;
    try {
        const std::string text = tok.decode(ids, skip);
        if (!megactx::utf8::is_valid(text)) __builtin_trap();
        megactx::StreamDecoder sd(tok, skip);
        std::string streamed;
        for (int32_t id : ids) streamed += sd.push(id);
        streamed += sd.flush();
        if (streamed != text) __builtin_trap();
    } catch (const megactx::Error&) {
        // An id outside the vocabulary: the documented Error.
    }
    return 0;
}
