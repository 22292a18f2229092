#pragma once
// The CRC-32 and size check of a zip archive's records (zip_check.cpp): no LibTorch here.
#include <filesystem>

#include "baton/error.hpp"

namespace baton::detail {
/// An error unless every record of the zip archive `file` holds what its directory says: its
/// size and CRC-32. open_archive calls it, so every .pt baton reads is checked; the message names
/// the file and the record ("w.pt: record 'archive/data/3' fails its CRC-32 check: the file is damaged ...").
Expected<void> check_zip_records(const std::filesystem::path& file);
}  // namespace baton::detail
