// CURVE keys of `tpdraft serve` (ZeroMQ's own encryption and server authentication over tcp://):
// a key is 40 characters of Z85 text, kept one per file. The server reads its secret key from a
// file only its user can read; a client is given the server's public key (the key itself or the
// file holding it) and makes a throwaway key pair of its own for each connection.
#pragma once

#include <string>

namespace tpdraft::serve {

constexpr size_t kCurveKeyChars = 40;

// Whether ZeroMQ here was built with CURVE (libsodium).
bool curve_available();
// The key in the file at `path` (one line; surrounding whitespace ignored). A secret key's file
// must not be readable by group or others. Throws tpdraft::Error naming `option` and the file.
std::string read_curve_key(const std::string& path, bool secret, const std::string& option);
// A server key given as the key itself or as the file holding it; throws naming `option`.
std::string server_key_from(const std::string& key_or_file, const std::string& option);
// Writes a fresh pair: PREFIX.secret (mode 600) and PREFIX.public; returns the public key.
// Refuses to overwrite either file; on failure leaves neither behind.
std::string write_curve_keys(const std::string& prefix);

}  // namespace tpdraft::serve
