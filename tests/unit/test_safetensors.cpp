// SafetensorsFile::parse on crafted byte images (every validation branch), the write_safetensors round trip,
// and TensorStore over single-file and sharded model directories.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_util.h"

namespace megactx {
namespace {

using json = nlohmann::json;
using test::error_of;
using test::expect_contains;
using test::safetensors_image;
using test::TempDir;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

std::map<std::string, TensorInfo> parse_image(const std::vector<uint8_t>& image) {
    return SafetensorsFile::parse(image.data(), image.size(), "crafted.safetensors");
}

// The error message for a one-tensor header `entry` followed by `data`.
std::string entry_error(const json& entry, size_t data_bytes = 8) {
    const auto image = safetensors_image(json{{"t", entry}}.dump(), std::vector<uint8_t>(data_bytes));
    return error_of([&] { parse_image(image); });
}

TEST(Safetensors, WriteThenOpenRoundTrips) {
    TempDir dir;
    const std::string path = dir / "model.safetensors";
    const std::vector<uint8_t> a = f32_bytes({1.0f, -2.0f, 3.5f, 0.0f, 7.0f, 9.0f});
    const std::vector<uint8_t> b = {0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40};  // bf16 1, 2, 3, 4
    const std::vector<uint8_t> c = {0x38, 0x40, 0xb8, 0x7e};                          // fp8 e4m3
    write_safetensors(path,
                      {{"a", DType::F32, {2, 3}, a}, {"b", DType::BF16, {4}, b}, {"c", DType::F8_E4M3, {2, 2}, c}});
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

    const auto raw = test::read_bytes(path);
    uint64_t header_len = 0;
    std::memcpy(&header_len, raw.data(), 8);
    EXPECT_EQ(header_len % 8, 0u);
    EXPECT_EQ(raw.size(), 8 + header_len + a.size() + b.size() + c.size());

    SafetensorsFile f(path);
    EXPECT_EQ(f.path(), path);
    ASSERT_EQ(f.tensors().size(), 3u);
    const TensorInfo& ta = f.tensors().at("a");
    EXPECT_EQ(ta.name, "a");
    EXPECT_EQ(ta.file, path);
    EXPECT_EQ(ta.dtype_name, "F32");
    EXPECT_TRUE(ta.dtype_known);
    EXPECT_EQ(ta.dtype, DType::F32);
    EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(ta.numel(), 6);
    EXPECT_EQ(ta.shape_str(), "[2, 3]");
    ASSERT_EQ(ta.nbytes, a.size());
    EXPECT_EQ(std::vector<uint8_t>(ta.data, ta.data + ta.nbytes), a);
    const TensorInfo& tb = f.tensors().at("b");
    EXPECT_EQ(tb.dtype, DType::BF16);
    EXPECT_EQ(tb.shape, (std::vector<int64_t>{4}));
    EXPECT_EQ(std::vector<uint8_t>(tb.data, tb.data + tb.nbytes), b);
    const TensorInfo& tc = f.tensors().at("c");
    EXPECT_EQ(tc.dtype, DType::F8_E4M3);
    EXPECT_EQ(std::vector<uint8_t>(tc.data, tc.data + tc.nbytes), c);
}

TEST(Safetensors, ParsesCraftedImageAndSkipsMetadata) {
    const json header = {{"__metadata__", {{"format", "pt"}}},
                         {"x", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}},
                         {"s", {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {0, 4}}}},
                         {"e", {{"dtype", "F32"}, {"shape", {0, 5}}, {"data_offsets", {12, 12}}}}};
    const auto image = safetensors_image(header.dump(), f32_bytes({42.0f, 1.5f, -3.0f}));
    const auto ts = parse_image(image);
    ASSERT_EQ(ts.size(), 3u);
    EXPECT_EQ(ts.count("__metadata__"), 0u);
    float v[2];
    std::memcpy(v, ts.at("x").data, 8);
    EXPECT_EQ(v[0], 1.5f);
    EXPECT_EQ(v[1], -3.0f);
    EXPECT_EQ(ts.at("s").numel(), 1);  // a scalar
    EXPECT_EQ(ts.at("e").numel(), 0);
    EXPECT_EQ(ts.at("e").nbytes, 0u);
}

TEST(Safetensors, UnknownDtypeParsesButIsMarked) {
    const json header = {{"q", {{"dtype", "I8"}, {"shape", {3}}, {"data_offsets", {0, 3}}}}};
    const auto ts = parse_image(safetensors_image(header.dump(), {1, 2, 3}));
    EXPECT_FALSE(ts.at("q").dtype_known);
    EXPECT_EQ(ts.at("q").dtype_name, "I8");
    EXPECT_EQ(ts.at("q").nbytes, 3u);
}

TEST(Safetensors, RejectsFileShorterThanTheLengthField) {
    for (size_t n : {0, 1, 7}) {
        const std::vector<uint8_t> image(n, 0);
        expect_contains(error_of([&] { SafetensorsFile::parse(n ? image.data() : nullptr, n, "short.st"); }),
                        {"short.st", "truncated", "header length is missing"});
    }
}

TEST(Safetensors, RejectsHeaderLengthBeyondFile) {
    const std::string header = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    auto image = safetensors_image(header, {0, 0, 0, 0}, header.size() + 5);
    expect_contains(error_of([&] { parse_image(image); }), {"crafted.safetensors", "header length", "runs past"});
    image = safetensors_image(header, {0, 0, 0, 0}, UINT64_MAX);  // no wrap-around in the bounds check
    expect_contains(error_of([&] { parse_image(image); }), {"runs past the end"});
}

TEST(Safetensors, RejectsHeaderThatIsNotJson) {
    const auto image = safetensors_image("{\"t\": {\"dtype\": ", {});
    expect_contains(error_of([&] { parse_image(image); }), {"crafted.safetensors", "not valid JSON"});
    const auto garbage = safetensors_image("\xff\xfe\x00garbage", {});
    expect_contains(error_of([&] { parse_image(garbage); }), {"not valid JSON"});
}

TEST(Safetensors, RejectsHeaderThatIsNotAnObject) {
    expect_contains(error_of([&] { parse_image(safetensors_image("[1, 2]", {})); }), {"must be a JSON object"});
}

TEST(Safetensors, RejectsEntryThatIsNotAnObject) {
    expect_contains(error_of([&] { parse_image(safetensors_image(R"({"w": 3})", {})); }),
                    {"tensor 'w'", "must be an object"});
}

TEST(Safetensors, RejectsMissingOrNonStringDtype) {
    expect_contains(entry_error({{"shape", {2}}, {"data_offsets", {0, 8}}}), {"tensor 't'", "'dtype'"});
    expect_contains(entry_error({{"dtype", 5}, {"shape", {2}}, {"data_offsets", {0, 8}}}), {"tensor 't'", "'dtype'"});
}

TEST(Safetensors, RejectsMissingOrBadShape) {
    expect_contains(entry_error({{"dtype", "F32"}, {"data_offsets", {0, 8}}}), {"tensor 't'", "'shape'"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", 2}, {"data_offsets", {0, 8}}}), {"'shape'"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}),
                    {"tensor 't'", "shape entries must be non-negative integers"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {2.0}}, {"data_offsets", {0, 8}}}),
                    {"shape entries must be non-negative integers"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {"2"}}, {"data_offsets", {0, 8}}}),
                    {"shape entries must be non-negative integers"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {int64_t{1} << 40}}, {"data_offsets", {0, 8}}}),
                    {"shape entries must be non-negative integers"});
}

TEST(Safetensors, RejectsShapeWhoseElementCountOverflows) {
    // Each dimension is accepted on its own, but the product is 2^78, which wraps a 64-bit count to 0: a
    // zero-byte span must not pass as a valid 2^78-element tensor.
    const int64_t d = int64_t{1} << 39;
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {d, d}}, {"data_offsets", {0, 0}}}, 0),
                    {"tensor 't'", "too large"});
    expect_contains(entry_error({{"dtype", "I8"}, {"shape", {d, d, 0}}, {"data_offsets", {0, 0}}}, 0), {"too large"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {1 << 24, 1 << 24}}, {"data_offsets", {0, 8}}}),
                    {"too large"});
}

TEST(Safetensors, RejectsMalformedDataOffsets) {
    const json base = {{"dtype", "F32"}, {"shape", {2}}};
    for (const json& off :
         {json(nullptr), json(8), json{0}, json{0, 4, 8}, json{-1, 7}, json{0.0, 8.0}, json{"0", "8"}}) {
        json e = base;
        if (!off.is_null()) e["data_offsets"] = off;
        expect_contains(entry_error(e), {"tensor 't'", "'data_offsets' must be two non-negative integers"});
    }
}

TEST(Safetensors, RejectsDataOffsetsOutOfRange) {
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 12}}}, 8),
                    {"crafted.safetensors", "tensor 't'", "data_offsets [0, 12] out of range", "8 bytes"});
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 4}}}, 8),
                    {"data_offsets [8, 4] out of range"});
    const uint64_t huge = UINT64_MAX;
    expect_contains(entry_error({{"dtype", "I8"}, {"shape", {2}}, {"data_offsets", {huge - 1, huge}}}, 8),
                    {"out of range"});
}

TEST(Safetensors, RejectsSpanThatDisagreesWithDtypeAndShape) {
    expect_contains(entry_error({{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}, 8),
                    {"tensor 't'", "F32 [3] needs 12 bytes but data_offsets span 8 bytes"});
    expect_contains(entry_error({{"dtype", "BF16"}, {"shape", {2, 2}}, {"data_offsets", {0, 4}}}, 8),
                    {"BF16 [2, 2] needs 8 bytes"});
}

TEST(Safetensors, OpenNamesMissingAndEmptyFiles) {
    TempDir dir;
    expect_contains(error_of([&] { SafetensorsFile f(dir / "nope.safetensors"); }),
                    {"nope.safetensors", "cannot open"});
    test::write_bytes(dir / "empty.safetensors", {});
    expect_contains(error_of([&] { SafetensorsFile f(dir / "empty.safetensors"); }),
                    {"empty.safetensors", "truncated"});
}

// A store fixture: tensors `a` [2, 2] F32, `b` [3] F32 and `q` [4] I8.
class TensorStoreTest : public ::testing::Test {
  protected:
    void write_single() {
        write_safetensors(dir_ / "model.safetensors", {{"a", DType::F32, {2, 2}, f32_bytes({1, 2, 3, 4})},
                                                       {"b", DType::F32, {3}, f32_bytes({5, 6, 7})}});
    }
    void write_sharded(const json& weight_map) {
        write_safetensors(dir_ / "s1.safetensors", {{"a", DType::F32, {2, 2}, f32_bytes({1, 2, 3, 4})}});
        write_safetensors(dir_ / "s2.safetensors", {{"b", DType::F32, {3}, f32_bytes({5, 6, 7})}});
        test::write_text(dir_ / "model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());
    }
    std::string store_error() {
        return error_of([&] { TensorStore s(dir_.path().string()); });
    }
    TempDir dir_;
};

TEST_F(TensorStoreTest, SingleFile) {
    write_single();
    TensorStore s(dir_.path().string());
    EXPECT_EQ(s.dir(), dir_.path().string());
    EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(s.has("a"));
    EXPECT_FALSE(s.has("c"));
    const TensorInfo& a = s.get("a", {2, 2});
    float v[4];
    std::memcpy(v, a.data, 16);
    EXPECT_EQ(v[3], 4.0f);
    EXPECT_EQ(s.get("b").shape, (std::vector<int64_t>{3}));
}

TEST_F(TensorStoreTest, ErrorsNameTensorFileAndShapes) {
    const std::string header = json{{"a", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}},
                                    {"q", {{"dtype", "I8"}, {"shape", {4}}, {"data_offsets", {16, 20}}}}}
                                   .dump();
    test::write_bytes(dir_ / "model.safetensors", safetensors_image(header, std::vector<uint8_t>(20)));
    TensorStore s(dir_.path().string());
    expect_contains(error_of([&] { s.get("missing.weight"); }),
                    {dir_.path().string(), "missing tensor 'missing.weight'"});
    expect_contains(error_of([&] {
                        s.get("a", {4, 1});
                    }),
                    {"model.safetensors", "tensor 'a' has shape [2, 2], expected [4, 1]"});
    expect_contains(error_of([&] { s.get("a", {2}); }), {"tensor 'a'", "expected [2]"});
    expect_contains(error_of([&] { s.get("q"); }), {"model.safetensors", "tensor 'q'", "unsupported dtype I8"});
    EXPECT_TRUE(s.has("q"));  // present but unusable: an error only when it is read
}

TEST_F(TensorStoreTest, Sharded) {
    write_sharded({{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    TensorStore s(dir_.path().string());
    EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(s.get("a").file, dir_ / "s1.safetensors");
    EXPECT_EQ(s.get("b", {3}).file, dir_ / "s2.safetensors");
    float v[3];
    std::memcpy(v, s.get("b").data, 12);
    EXPECT_EQ(v[2], 7.0f);
}

TEST_F(TensorStoreTest, IndexTakesPrecedenceOverSingleFile) {
    write_single();
    write_sharded({{"a", "s1.safetensors"}});
    TensorStore s(dir_.path().string());
    EXPECT_EQ(s.names(), (std::vector<std::string>{"a"}));
    EXPECT_EQ(s.get("a").file, dir_ / "s1.safetensors");
}

TEST_F(TensorStoreTest, ShardedIndexNamesMissingShard) {
    write_sharded({{"a", "s1.safetensors"}, {"b", "s3.safetensors"}});
    expect_contains(store_error(), {"s3.safetensors", "cannot open"});
}

TEST_F(TensorStoreTest, ShardedTensorMissingFromItsShard) {
    write_sharded({{"a", "s2.safetensors"}, {"b", "s2.safetensors"}});
    expect_contains(store_error(),
                    {"s2.safetensors", "tensor 'a'", "model.safetensors.index.json", "missing from the shard"});
}

TEST_F(TensorStoreTest, ShardedIndexErrors) {
    test::write_text(dir_ / "model.safetensors.index.json", "{\"weight_map\": ");
    expect_contains(store_error(), {"model.safetensors.index.json", "not valid JSON"});
    test::write_text(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
    expect_contains(store_error(), {"model.safetensors.index.json", "'weight_map'"});
    test::write_text(dir_ / "model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
    expect_contains(store_error(), {"weight_map['a'] must be a file name"});
    for (const char* shard : {"../s1.safetensors", "/etc/passwd", "..", ""}) {
        test::write_text(dir_ / "model.safetensors.index.json", json{{"weight_map", {{"a", shard}}}}.dump());
        expect_contains(store_error(), {"weight_map['a']", "not a file in the model directory"});
    }
}

TEST_F(TensorStoreTest, CorruptShardNamesTheShard) {
    write_sharded({{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    auto bytes = test::read_bytes(dir_ / "s2.safetensors");
    ASSERT_GT(bytes.size(), 4u);
    bytes.erase(bytes.end() - 4, bytes.end());  // truncate the data section
    test::write_bytes(dir_ / "s2.safetensors", bytes);
    expect_contains(store_error(), {"s2.safetensors", "tensor 'b'", "out of range"});
}

TEST_F(TensorStoreTest, DirectoryErrors) {
    expect_contains(store_error(), {dir_.path().string(), "no model.safetensors or model.safetensors.index.json"});
    const std::string missing = dir_ / "does-not-exist";
    expect_contains(error_of([&] { TensorStore s(missing); }), {missing, "model directory does not exist"});
}

}  // namespace
}  // namespace megactx
