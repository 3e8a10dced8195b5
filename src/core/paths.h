// core/paths.h — the one setting that locates the shared test data and the default model, and the
// directory of what fastpath measured of this machine.
#pragma once
#include <string>

namespace fp {

// $FASTPATH_TESTDATA when set, else ../shared/testdata beside the source checkout.
std::string testdata_dir();
// The model `generate` uses when -m is not given: stories260K.gguf in the test data.
std::string default_model_path();
// Where fastpath keeps what it measured of this machine (ceilings, timed kernel choices):
// $XDG_CACHE_HOME/fastpath, else ~/.cache/fastpath.
std::string fastpath_cache_dir();
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace fp
