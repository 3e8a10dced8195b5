// tokenizer/unicode_tables.h — declarations of the generated tables in unicode_tables.cpp.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fp::uni::tables {
extern const uint32_t kCategory[];
extern const size_t kCategoryCount;
extern const uint32_t kCombining[];
extern const size_t kCombiningCount;
extern const uint32_t kDecomposition[];  // triples
extern const size_t kDecompositionCount;  // number of uint32 values (3 per entry)
}  // namespace fp::uni::tables
