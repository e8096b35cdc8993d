// The text of one request's completion as its tokens arrive: byte pieces
// joined, cut at the first stop string, released in whole UTF-8 characters
// and never past a point where a stop string could still begin. Pure (no
// model, no I/O), so its edge cases are unit-tested (tests/serve).
#pragma once

#include <string>
#include <vector>

namespace activekv::serve {

class TextStream {
 public:
  /// `stop`: strings that end the completion (not included in it); empty ones are ignored.
  explicit TextStream(std::vector<std::string> stop = {});

  /// Appends a token's bytes. Returns true if the text now contains a stop
  /// string: the completion ends before it and later pieces are ignored.
  bool push(const std::string& piece);
  /// Text that can be sent now and was not yet: whole UTF-8 characters, none
  /// that could be the start of a stop string.
  std::string take();
  /// At the end: everything not yet sent (a trailing broken UTF-8 sequence
  /// included; the JSON layer replaces it with U+FFFD).
  std::string finish();
  /// Everything accepted so far (without the stop string).
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

/// Length of the longest prefix of `s` that does not end inside a UTF-8
/// sequence (a lead byte whose continuation bytes have not all arrived).
size_t complete_utf8_prefix(const std::string& s);

}  // namespace activekv::serve
