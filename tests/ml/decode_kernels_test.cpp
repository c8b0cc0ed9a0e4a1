// bf16_linear (runtime/ml/policy/decode_kernels.hpp): its definition in plain C++, every
// instruction set bit for bit against it, batch invariance, and closeness to at::linear on the fp32
// image.
#include "runtime/ml/policy/decode_kernels.hpp"
#include "runtime/ml/policy/model.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace sorl::ml;

namespace {

std::vector<std::string> runnable_isas() {
  std::vector<std::string> out;
  for (const char* name : {"scalar", "avx2", "avx512"}) {
    try {
      set_bf16_linear_isa(name);
      out.emplace_back(name);
    } catch (const std::invalid_argument&) {
    }
  }
  set_bf16_linear_isa("");
  return out;
}

struct isa_reset {
  ~isa_reset() { set_bf16_linear_isa(""); }
};

at::Tensor randn(std::int64_t r, std::int64_t c, std::uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::empty({r, c}, at::kFloat).normal_(0.0, 1.0, g);
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() &&
         std::memcmp(a.contiguous().data_ptr<float>(), b.contiguous().data_ptr<float>(),
                     static_cast<std::size_t>(a.numel()) * sizeof(float)) == 0;
}

// Element by element through bf16_dot_reference.
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const std::int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, N}, at::kFloat);
  const auto* wp = reinterpret_cast<const std::uint16_t*>(w.data_ptr<at::BFloat16>());
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float v = bf16_dot_reference(x.data_ptr<float>() + m * K, wp + n * K, K);
      if (bias.defined()) v += bias.data_ptr<float>()[n];
      y.data_ptr<float>()[m * N + n] = v;
    }
  return y;
}

}  // namespace

TEST_CASE("bf16_dot_reference sums 16 lanes in a fixed tree", "[decode_kernels]") {
  // x = (1, 2^-24, 2^-24, ...), w = 1: a left-to-right sum loses every tiny term against 1,
  // the 16 lanes and the tree keep most of them, so the order of additions shows.
  const std::int64_t K = 35;  // two full blocks and a tail of three
  std::vector<float> x(K);
  std::vector<std::uint16_t> w(K);
  for (std::int64_t k = 0; k < K; ++k) {
    x[static_cast<std::size_t>(k)] = k == 0 ? 1.0f : 1.0f / 16777216.0f;  // 1 then 2^-24
    const float one = 1.0f;
    std::uint32_t u;
    std::memcpy(&u, &one, sizeof u);
    w[static_cast<std::size_t>(k)] = static_cast<std::uint16_t>(u >> 16);  // bf16 1.0
  }
  float ltr = 0.0f;
  for (std::int64_t k = 0; k < K; ++k) ltr = std::fma(x[static_cast<std::size_t>(k)], 1.0f, ltr);
  CHECK(ltr == 1.0f);
  const float tree = bf16_dot_reference(x.data(), w.data(), K);
  // By hand: lane 0 = 1 (its two tiny terms round away), lanes 1, 2 hold 3 * 2^-24, lanes
  // 3..15 hold 2 * 2^-24. Tree: s8[0] = 1 + 2^-23, s4[0] = 1 + 3 * 2^-23, s2a = 1 + 15 * 2^-24
  // -> 1 + 2^-20 (tie to even), s2b = 17 * 2^-24, total 1 + 33 * 2^-24 -> 1 + 2^-19 (tie to even).
  CHECK(tree == 1.0f + 1.0f / 524288.0f);
}

TEST_CASE("bf16_linear is its reference bit for bit on every instruction set and shape", "[decode_kernels]") {
  isa_reset reset;
  const auto isas = runnable_isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == "scalar");
  struct shape { std::int64_t M, K, N; bool bias; };
  const std::vector<shape> shapes = {{1, 1, 1, false},   {1, 16, 4, false},  {1, 576, 192, true},
                                     {3, 17, 5, true},   {5, 33, 9, false},  {7, 100, 13, true},
                                     {64, 128, 272, false}, {2, 1536, 37, false}, {9, 15, 3, true},
                                     {8, 33, 7, true},   {13, 100, 13, false}, {32, 576, 6, true},
                                     // whole 4 x 4 tiles only, and with edges on both sides
                                     {32, 64, 16, true}, {12, 40, 8, false}, {36, 1536, 20, true},
                                     {33, 577, 18, true}, {64, 576, 192, false}};
  for (const auto& s : shapes) {
    const at::Tensor x = randn(s.M, s.K, 1 + static_cast<std::uint64_t>(s.K));
    const at::Tensor w = randn(s.N, s.K, 2 + static_cast<std::uint64_t>(s.N)).to(at::kBFloat16);
    const at::Tensor b = s.bias ? randn(1, s.N, 3).view({s.N}) : at::Tensor{};
    const at::Tensor ref = reference(x, w, b);
    for (const auto& name : isas) {
      set_bf16_linear_isa(name);
      INFO("isa " << name << " M " << s.M << " K " << s.K << " N " << s.N);
      CHECK(bitwise_equal(bf16_linear(x, w, b), ref));
    }
  }
}

TEST_CASE("bf16_linear gives a row the same bits whatever else is in the batch", "[decode_kernels]") {
  const at::Tensor x = randn(37, 200, 7);
  const at::Tensor w = randn(50, 200, 8).to(at::kBFloat16);
  const at::Tensor all = bf16_linear(x, w);
  for (std::int64_t r : {0, 5, 36}) {
    CHECK(bitwise_equal(bf16_linear(x.narrow(0, r, 1), w), all.narrow(0, r, 1)));
    if (r + 3 <= 37) CHECK(bitwise_equal(bf16_linear(x.narrow(0, r, 3), w), all.narrow(0, r, 3)));
  }
  // One thread or several: the columns are split among them, each element summed alike.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const at::Tensor one = bf16_linear(x, w);
  at::set_num_threads(threads);
  CHECK(bitwise_equal(one, all));
}

TEST_CASE("the kernels' parallel loops run on every thread libtorch is given", "[decode_kernels]") {
  // at::parallel_for is a `#pragma omp parallel` in ATen's headers: a kernel source built
  // without OpenMP runs it on one thread whatever at::set_num_threads says.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  CHECK(kernel_threads() == 1);
  at::set_num_threads(2);
  CHECK(kernel_threads() == 2);
  at::set_num_threads(threads);
}

TEST_CASE("bf16_linear agrees with at::linear on the fp32 image within fp32 rounding", "[decode_kernels]") {
  const at::Tensor x = randn(6, 576, 9);
  const at::Tensor w = randn(300, 576, 10).to(at::kBFloat16);
  const at::Tensor b = randn(1, 300, 11).view({300});
  const at::Tensor ours = bf16_linear(x, w, b);
  const at::Tensor ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
  // The exact sum in double, against which an fp32 sum of 576 products errs by at most a few
  // ulps of sum |x_k w_k| (about 576 * 0.8 here): 1e-4 absolute is ~20x the typical error.
  const double err = (ours.to(at::kDouble) - ref).abs().max().item<double>();
  CHECK(err < 1e-4);
  CHECK(err > 0.0);  // fp32 arithmetic: not the double result
  const double aten = (at::linear(x, w.to(at::kFloat), b).to(at::kDouble) - ref).abs().max().item<double>();
  CHECK(err < 4 * aten + 1e-5);  // no worse than libtorch's own fp32 product, give or take
}

TEST_CASE("bf16_linear refuses what it cannot compute", "[decode_kernels]") {
  const at::Tensor x = randn(2, 8, 1);
  const at::Tensor w = randn(4, 8, 2).to(at::kBFloat16);
  CHECK_THROWS_WITH(bf16_linear(x, w.to(at::kFloat)), Catch::Contains("bf16"));
  CHECK_THROWS_WITH(bf16_linear(x.to(at::kDouble), w), Catch::Contains("fp32"));
  CHECK_THROWS_WITH(bf16_linear(randn(2, 9, 1), w), Catch::Contains("K = 9"));
  CHECK_THROWS_WITH(bf16_linear(x, w, at::zeros({5})), Catch::Contains("bias"));
  CHECK(bf16_linear(randn(0, 8, 1).narrow(0, 0, 0), w).sizes() == at::IntArrayRef({0, 4}));
  CHECK_THROWS_AS(set_bf16_linear_isa("neon"), std::invalid_argument);
}

TEST_CASE("paged_decode_attention reads the pool in place like a padded softmax attention", "[decode_kernels]") {
  isa_reset reset;
  // Three sequences of lengths 1, 7 and 20 in a pool of 40 slots, positions scattered.
  const std::int64_t H = 6, KV = 2, hd = 10, slots_n = 40, S = 20;
  const at::Tensor q = randn(3, H * hd, 21).view({3, H, hd});
  const at::Tensor keys = randn(slots_n, KV * hd, 22);
  const at::Tensor vals = randn(slots_n, KV * hd, 23);
  const std::vector<std::int64_t> lengths = {1, 7, 20};
  at::Tensor slots = at::full({3, S}, 0, at::kLong);  // past a length: ignored
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t j = 0; j < lengths[static_cast<std::size_t>(b)]; ++j)
      slots[b][j] = (7 * j + 13 * b + 3) % slots_n;
  // The reference in double: softmax(q k^T / sqrt(hd)) v per head, kv head h / (H / KV).
  at::Tensor want = at::empty({3, H * hd}, at::kDouble);
  for (std::int64_t b = 0; b < 3; ++b) {
    const std::int64_t len = lengths[static_cast<std::size_t>(b)];
    const at::Tensor idx = slots[b].narrow(0, 0, len);
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / (H / KV);
      const at::Tensor k = keys.index_select(0, idx).narrow(1, g * hd, hd).to(at::kDouble);
      const at::Tensor v = vals.index_select(0, idx).narrow(1, g * hd, hd).to(at::kDouble);
      const at::Tensor p = at::softmax(at::mv(k, q[b][h].to(at::kDouble)) / std::sqrt(double(hd)), 0);
      want[b].narrow(0, h * hd, hd).copy_(at::mv(v.t(), p));
    }
  }
  std::vector<at::Tensor> got;
  for (const auto& name : runnable_isas()) {
    if (name == "avx512") continue;  // the attention's vector code is AVX2 on both
    set_bf16_linear_isa(name);
    got.push_back(paged_decode_attention(q, keys, vals, slots, lengths, KV));
    INFO("isa " << name);
    CHECK((got.back().to(at::kDouble) - want).abs().max().item<double>() < 1e-5);
  }
  for (std::size_t i = 1; i < got.size(); ++i) CHECK(bitwise_equal(got[i], got[0]));  // plain C++ = AVX2
  // A sequence's output does not depend on its batch mates.
  const at::Tensor alone = paged_decode_attention(q.narrow(0, 1, 1), keys, vals, slots.narrow(0, 1, 1), {7}, KV);
  CHECK(bitwise_equal(alone, got[0].narrow(0, 1, 1)));
  CHECK_THROWS_WITH(paged_decode_attention(q, keys, vals, slots, {1, 7, 21}, KV), Catch::Contains("length 21"));
  at::Tensor bad = slots.clone();
  bad[2][5] = slots_n;
  CHECK_THROWS_WITH(paged_decode_attention(q, keys, vals, bad, lengths, KV), Catch::Contains("slot 40"));
  CHECK_THROWS_WITH(paged_decode_attention(q, keys, vals, slots, lengths, 4), Catch::Contains("kv heads"));
}

TEST_CASE("apply_rope_inplace is apply_rope bit for bit", "[decode_kernels]") {
  const at::Tensor x = randn(5, 3 * 12, 31).view({5, 3, 12});
  const at::Tensor cos = randn(5, 6, 32), sin = randn(5, 6, 33);
  at::Tensor y = x.clone();
  apply_rope_inplace(y, cos, sin);
  CHECK(bitwise_equal(y, apply_rope(x, cos, sin)));
  at::Tensor odd = randn(2, 5, 1).view({2, 1, 5});
  CHECK_THROWS_WITH(apply_rope_inplace(odd, cos, sin), Catch::Contains("even hd"));
}

TEST_CASE("rms_norm_rows is rms_norm with the mean of squares taken exactly", "[decode_kernels]") {
  const double eps = 1e-5;
  for (const std::int64_t d : {1, 7, 8, 9, 64, 576, 1001}) {
    INFO("d " << d);
    const at::Tensor x = randn(6, d, 40 + static_cast<std::uint64_t>(d)).mul_(3.0);
    const at::Tensor w = randn(1, d, 41).view({d});
    const at::Tensor got = rms_norm_rows(x, w, eps);
    // The fp64 reference of every step but the last two roundings, which rms_norm_rows shares
    // with rms_norm: (x · r) then · w, each rounded to fp32.
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor mean = xd.pow(2).sum(-1, true).div(static_cast<double>(d)).to(at::kFloat);
    const at::Tensor r = (mean + static_cast<float>(eps)).sqrt().reciprocal();
    CHECK(bitwise_equal(got, (x * r) * w));
    // ATen's fp32 sum differs from the exact one in the last bits of the mean only.
    const at::Tensor aten = rms_norm(x, w, eps);
    CHECK((got - aten).abs().max().item<double>() <= 4e-7 * (1.0 + aten.abs().max().item<double>()));
  }
}

TEST_CASE("rms_norm_rows gives a row the same bits whatever else is in the batch", "[decode_kernels]") {
  at::set_num_threads(2);
  const at::Tensor x = randn(37, 576, 50), w = randn(1, 576, 51).view({576});
  const at::Tensor all = rms_norm_rows(x, w, 1e-6);
  for (const std::int64_t row : {0, 17, 36})
    CHECK(bitwise_equal(rms_norm_rows(x.narrow(0, row, 1).contiguous(), w, 1e-6), all.narrow(0, row, 1)));
  CHECK_THROWS_WITH(rms_norm_rows(x.t(), w, 1e-6), Catch::Contains("contiguous [N, d]"));
  CHECK_THROWS_WITH(rms_norm_rows(x, w.narrow(0, 0, 5), 1e-6), Catch::Contains("weight must be"));
}
