// The one exception type of tpdraft and the checks that raise it.
// Every message names what is at fault (file, tensor, field, rank) and what was expected;
// the library never exits the process: callers (the CLI's main) decide.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace tpdraft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An Error in the input found while working (a weight row read during a draft): the program
// reports it as bad input, not as a fault of the run.
class InputError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
[[noreturn]] void throw_input_error(const std::string& message);

// What a caught exception says: its what(), or "unknown exception" for one of no std type.
std::string message_of(const std::exception_ptr& error);

}  // namespace tpdraft

// TPDRAFT_CHECK(cond, "fmt {}", args...): throws tpdraft::Error with the message when cond is false.
#define TPDRAFT_CHECK(cond, ...)                                              \
  do {                                                                        \
    if (!(cond)) ::tpdraft::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define TPDRAFT_FAIL(...) ::tpdraft::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))

// TPDRAFT_CHECK_INPUT(cond, "fmt {}", args...): throws tpdraft::InputError when cond is false.
#define TPDRAFT_CHECK_INPUT(cond, ...)                                     \
  do {                                                                     \
    if (!(cond)) ::tpdraft::throw_input_error(fmt::format(__VA_ARGS__));   \
  } while (0)
