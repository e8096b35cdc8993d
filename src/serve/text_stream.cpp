// See text_stream.h.
#include "text_stream.h"

#include <algorithm>

namespace activekv::serve {

TextStream::TextStream(std::vector<std::string> stop) {
  for (auto& s : stop) {
    if (s.empty()) continue;
    longest_stop_ = std::max(longest_stop_, s.size());
    stop_.push_back(std::move(s));
  }
}

bool TextStream::push(const std::string& piece) {
  if (stopped_) return true;
  // A stop string may straddle pieces: search from where one could begin.
  const size_t from = text_.size() >= longest_stop_ ? text_.size() - longest_stop_ + 1 : 0;
  text_ += piece;
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, text_.find(s, from));
  if (cut == std::string::npos) return false;
  text_.resize(std::max(cut, sent_));  // never un-send text (cut < sent_ cannot happen: see take())
  stopped_ = true;
  return true;
}

std::string TextStream::take() {
  size_t end = text_.size();
  // Hold back the tail that could be the beginning of a stop string.
  if (!stopped_ && longest_stop_ > 0) end = text_.size() >= longest_stop_ - 1 ? text_.size() - (longest_stop_ - 1) : 0;
  end = std::max(sent_, std::min(end, complete_utf8_prefix(text_.substr(0, end))));
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::string TextStream::finish() {
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

size_t complete_utf8_prefix(const std::string& s) {
  // Look back at most 3 bytes for the lead byte of the last sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking
    const size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return back < need ? n - back : n;
  }
  return n;  // only continuation bytes: broken input, nothing to wait for
}

}  // namespace activekv::serve
