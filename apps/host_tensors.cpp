#include "host_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <numeric>

namespace kvattn_cli {

using kvattn::DType;

namespace {
constexpr std::align_val_t kAlign{64};
uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
}  // namespace

// ---- scalar conversions -------------------------------------------------------------------------
float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // ties to even
  return uint16_t(u >> 16);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (a < 0x38800000u)                                    // below 2^-14: subnormal or zero
    return uint16_t(sign | uint32_t(std::nearbyint(bits_float(a) * 16777216.0f)));
  uint32_t mant = a & 0x7fffffu, h = (((a >> 23) - 112) << 10) | (mant >> 13), rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

// ---- HostTensor ---------------------------------------------------------------------------------
void HostTensor::Free::operator()(std::byte* p) const { ::operator delete[](p, kAlign); }

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  KVATTN_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16 ||
                   dtype == DType::i32 || dtype == DType::u8,
               "the kvattn tool's host tensors do not support dtype ", kvattn::dtype_name(dtype));
  KVATTN_CHECK(!shape_.empty() && shape_.size() <= size_t(kvattn::TensorView::kMaxDims),
               "a host tensor has 1 to ", kvattn::TensorView::kMaxDims, " dimensions");
  numel_ = 1;
  for (int64_t s : shape_) {
    KVATTN_CHECK(s >= 0, "negative host tensor dimension ", s);
    numel_ *= s;
  }
  size_t bytes = std::max<size_t>(nbytes(), 1);
  data_.reset(static_cast<std::byte*>(::operator new[](bytes, kAlign)));
  std::memset(data_.get(), 0, bytes);
}

kvattn::TensorView HostTensor::view() const {
  return kvattn::TensorView(data_.get(), dtype_, int(shape_.size()), shape_.data(), nullptr);
}

double HostTensor::get(int64_t i) const {
  switch (dtype_) {
    case DType::f32: return data_as<float>()[i];
    case DType::f16: return f16_to_float(data_as<uint16_t>()[i]);
    case DType::bf16: return bf16_to_float(data_as<uint16_t>()[i]);
    case DType::i32: return data_as<int32_t>()[i];
    case DType::u8: return data_as<uint8_t>()[i];
    default: return NAN;
  }
}

void HostTensor::set(int64_t i, double value) {
  switch (dtype_) {
    case DType::f32: data_as<float>()[i] = float(value); break;
    case DType::f16: data_as<uint16_t>()[i] = float_to_f16(float(value)); break;
    case DType::bf16: data_as<uint16_t>()[i] = float_to_bf16(float(value)); break;
    case DType::i32: data_as<int32_t>()[i] = int32_t(value); break;
    case DType::u8: data_as<uint8_t>()[i] = uint8_t(value); break;
    default: break;
  }
}

void HostTensor::fill_uniform(Rng& rng, double lo, double hi) {
  for (int64_t i = 0; i < numel_; ++i) set(i, rng.uniform(lo, hi));
}

void HostTensor::fill(double value) {
  for (int64_t i = 0; i < numel_; ++i) set(i, value);
}

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, {int64_t(values.size())});
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

// ---- page tables --------------------------------------------------------------------------------
std::vector<int32_t> PageAssignment::unowned_pages() const {
  std::vector<char> owned(size_t(num_pages), 0);
  for (const auto& list : pages)
    for (int32_t p : list) owned[size_t(p)] = 1;
  std::vector<int32_t> out;
  for (int64_t p = 0; p < num_pages; ++p)
    if (!owned[size_t(p)]) out.push_back(int32_t(p));
  return out;
}

PageAssignment assign_pages(const std::vector<int64_t>& capacity, int page_size, Rng& rng,
                            bool scatter, double spare) {
  KVATTN_CHECK(page_size >= 1, "page_size must be at least 1, got ", page_size);
  PageAssignment a;
  a.page_size = page_size;
  int64_t needed = 0;
  for (int64_t c : capacity) needed += (c + page_size - 1) / page_size;
  a.num_pages = scatter ? needed + int64_t(std::ceil(double(needed) * spare)) : needed;
  std::vector<int32_t> pool(size_t(a.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  if (scatter)  // Fisher-Yates with our own generator (std::shuffle's output is not portable)
    for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[size_t(rng.uniform_int(0, int64_t(i) - 1))]);
  size_t next = 0;
  for (int64_t c : capacity) {
    int64_t n = (c + page_size - 1) / page_size;
    a.pages.emplace_back(pool.begin() + ptrdiff_t(next), pool.begin() + ptrdiff_t(next + size_t(n)));
    next += size_t(n);
  }
  return a;
}

HostPageTable make_page_table(const PageAssignment& a, const std::vector<int64_t>& lengths) {
  KVATTN_CHECK(lengths.size() == a.pages.size(), "make_page_table: ", lengths.size(),
               " lengths for ", a.pages.size(), " requests");
  std::vector<int32_t> indptr{0}, indices, last;
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t n = (lengths[b] + a.page_size - 1) / a.page_size;
    KVATTN_CHECK(n <= int64_t(a.pages[b].size()), "request ", b, " has length ", lengths[b],
                 " but only ", a.pages[b].size(), " pages");
    indices.insert(indices.end(), a.pages[b].begin(), a.pages[b].begin() + ptrdiff_t(n));
    indptr.push_back(int32_t(indices.size()));
    last.push_back(n == 0 ? 0 : int32_t(lengths[b] - (n - 1) * a.page_size));
  }
  return {int32_tensor(indptr), int32_tensor(indices), int32_tensor(last)};
}

// ---- timing and formatting ----------------------------------------------------------------------
Timing summarize(std::vector<double> seconds) {
  Timing t;
  t.seconds = seconds;
  if (seconds.empty()) return t;
  std::sort(seconds.begin(), seconds.end());
  size_t n = seconds.size();
  t.median = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  t.min = seconds.front();
  t.max = seconds.back();
  return t;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  else if (s < 1.0)
    std::snprintf(buf, sizeof buf, "%.*f ms", s < 1e-2 ? 2 : s < 1e-1 ? 1 : 0, s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string format_rate(double per_second, const char* unit) {
  static const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (i < 5 && per_second >= 1000.0) {
    per_second /= 1000.0;
    ++i;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s%s/s", per_second < 10 ? 2 : per_second < 100 ? 1 : 0,
                per_second, prefixes[i], unit);
  return buf;
}

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace kvattn_cli
