// Tokenizer core on tiny handmade vocabularies: pre-tokenizer split, byte map,
// merge order, special tokens, decode errors, chat template.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "activekv/tokenizer/tokenizer.h"
#include "internal.h"

using activekv::ChatMessage;
using activekv::Tokenizer;
using namespace activekv::tok;

namespace {

// Words of `text` after pre-tokenization, as raw bytes.
std::vector<std::string> split(std::string_view text, PreTokenizer kind = PreTokenizer::SmolLM) {
  std::vector<CodePoint> scratch;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  pretokenize(text, kind, scratch, ranges);
  std::vector<std::string> out;
  for (auto [b, e] : ranges) out.emplace_back(text.substr(b, e - b));
  return out;
}

using W = std::vector<std::string>;

// A vocabulary of the 256 byte tokens, then one token per merge, then extras.
Tokenizer::Vocab tiny_vocab(const std::vector<std::string>& merges,
                            const std::vector<std::string>& specials = {}) {
  Tokenizer::Vocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_level_encode(std::string(1, char(b))));
  for (const auto& m : merges) {
    const size_t sp = m.find(' ');
    v.tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
  }
  v.token_types.assign(v.tokens.size(), 1);
  for (const auto& s : specials) {
    v.tokens.push_back(s);
    v.token_types.push_back(3);
  }
  v.merges = merges;
  return v;
}

}  // namespace

TEST(Pretokenize, Gpt2RegexBranches) {
  // Expectations checked against HF tokenizers' pre_tokenize_str.
  EXPECT_EQ(split("Hello  world!! "), (W{"Hello", " ", " world", "!!", " "}));
  EXPECT_EQ(split("   x"), (W{"  ", " x"}));
  EXPECT_EQ(split("I'm DON'T they're x'll '"),
            (W{"I", "'m", " DON", "'", "T", " they", "'re", " x", "'ll", " '"}));
  EXPECT_EQ(split("\n\n\n"), (W{"\n\n\n"}));
  EXPECT_EQ(split("a \n \n  e  \r\n"), (W{"a", " \n \n ", " e", "  \r\n"}));
  EXPECT_EQ(split(""), W{});
}

TEST(Pretokenize, SmolLMSplitsEveryDigit) {
  EXPECT_EQ(split("x=12.5e3\n\n\tif"),
            (W{"x", "=", "1", "2", ".", "5", "e", "3", "\n\n", "\t", "if"}));
  // Whitespace before a digit is not glued to it (the run ends at the digit).
  EXPECT_EQ(split("a   1"), (W{"a", "   ", "1"}));
  EXPECT_EQ(split("a   1", PreTokenizer::Gpt2), (W{"a", "  ", " 1"}));
  EXPECT_EQ(split("x=12", PreTokenizer::Gpt2), (W{"x", "=", "12"}));
  // Non-ASCII digits are \p{N} too.
  EXPECT_EQ(split("\xd9\xa3\xd9\xa4"), (W{"\xd9\xa3", "\xd9\xa4"}));  // Arabic-Indic 3 4
}

TEST(Pretokenize, UnicodeClasses) {
  // NBSP and U+3000 are \s, ZWSP is not; letters with accents are \p{L}.
  EXPECT_EQ(split("ab\u00a0cd\u200b e\u3000f"),
            (W{"ab", "\u00a0", "cd", "\u200b", " e", "\u3000", "f"}));
  EXPECT_EQ(split("caf\u00e9 \u65e5\u672c"), (W{"caf\u00e9", " \u65e5\u672c"}));
  // Invalid UTF-8 bytes are kept, classed as neither letter, digit nor space.
  EXPECT_EQ(split("a\xff\xfe b"), (W{"a", "\xff\xfe", " b"}));
  EXPECT_EQ(split("\xe6\x97"), (W{"\xe6\x97"}));  // truncated sequence
}

TEST(ByteLevel, TableIsGpt2s) {
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_to_unicode('A'), uint32_t('A'));
  EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(byte_to_unicode(uint8_t(b))), b);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
  EXPECT_EQ(byte_level_encode(" hi\n"), "\u0120hi\u010a");
}

TEST(Bpe, MergesApplyByRankNotPosition) {
  // "abc": a+b has rank 1, b+c rank 0, so b+c wins; then nothing merges "a","bc".
  auto v = tiny_vocab({"b c", "a b"});
  Tokenizer t(v);
  const int32_t bc = 256, ab = 257;
  EXPECT_EQ(t.encode("abc", false), (std::vector<int32_t>{'a', bc}));
  EXPECT_EQ(t.encode("abx", false), (std::vector<int32_t>{ab, 'x'}));
  // Leftmost first on a tie: "aaa" with "a a" -> "aa", "a".
  Tokenizer t2(tiny_vocab({"a a", "aa aa"}));
  EXPECT_EQ(t2.encode("aaa", false), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(t2.encode("aaaa", false), (std::vector<int32_t>{257}));
  EXPECT_EQ(t2.encode("aaaaa", false), (std::vector<int32_t>{257, 'a'}));
}

TEST(Bpe, SpacePrefixedWords) {
  Tokenizer t(tiny_vocab({"\u0120 h", "\u0120h i"}));
  EXPECT_EQ(t.encode("hi hi", false), (std::vector<int32_t>{'h', 'i', 257}));
  EXPECT_EQ(t.decode(t.encode("hi hi", false)), "hi hi");
}

TEST(Tokenizer, SpecialTokensLongestFirst) {
  auto v = tiny_vocab({}, {"<|a|>", "<|a|>x", "<s>"});
  v.bos_id = 258;
  Tokenizer t(v);
  EXPECT_EQ(t.encode("q<|a|>xy<|a|><s>", false),
            (std::vector<int32_t>{'q', 257, 'y', 256, 258}));
  EXPECT_EQ(t.encode("q<s>", true), (std::vector<int32_t>{258, 'q', 258}));
  // parse_special=false: the text is ordinary bytes.
  const auto plain = t.encode("<s>", false, false);
  EXPECT_EQ(plain.size(), 3u);
  EXPECT_EQ(t.decode(plain), "<s>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{256, 'z'}), "<|a|>z");
  EXPECT_EQ(t.token_to_piece(257), "<|a|>x");
}

TEST(Tokenizer, DecodeRejectsBadIds) {
  Tokenizer t(tiny_vocab({}));
  const std::vector<int32_t> bad{'a', 999};
  try {
    (void)t.decode(bad);
    FAIL() << "expected an Error";
  } catch (const activekv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("999"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)t.decode(std::vector<int32_t>{-1}), activekv::Error);
  EXPECT_THROW((void)t.token_to_piece(256), activekv::Error);
}

TEST(Tokenizer, RoundTripsArbitraryBytes) {
  Tokenizer t(tiny_vocab({"\u0120 \u0120", "a b"}));
  std::string all;
  for (int rep = 0; rep < 3; ++rep)
    for (int b = 0; b < 256; ++b) all.push_back(char(b));
  all += "   ab ab\n\n  \xf0\x9f\x98\x80 1234";
  EXPECT_EQ(t.decode(t.encode(all, false)), all);
}

TEST(Tokenizer, RejectsBadVocabularies) {
  EXPECT_THROW(Tokenizer(Tokenizer::Vocab{}), activekv::InvalidArgument);
  auto v = tiny_vocab({});
  v.merges = {"a zz"};
  EXPECT_THROW(Tokenizer{v}, activekv::InvalidArgument);
  v = tiny_vocab({});
  v.merges = {"ab"};
  EXPECT_THROW(Tokenizer{v}, activekv::InvalidArgument);
  v = tiny_vocab({});
  v.pre = "llama3";
  EXPECT_THROW(Tokenizer{v}, activekv::InvalidArgument);
  v = tiny_vocab({});
  v.eos_id = 100000;
  EXPECT_THROW(Tokenizer{v}, activekv::InvalidArgument);
  v = tiny_vocab({});
  v.token_types.pop_back();
  EXPECT_THROW(Tokenizer{v}, activekv::InvalidArgument);
}

TEST(Tokenizer, EndOfGeneration) {
  auto v = tiny_vocab({}, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  v.eos_id = 'e';
  Tokenizer t(v);
  EXPECT_TRUE(t.is_end_of_generation('e'));
  EXPECT_TRUE(t.is_end_of_generation(256));
  EXPECT_FALSE(t.is_end_of_generation(257));
  EXPECT_TRUE(t.is_end_of_generation(258));
  EXPECT_FALSE(t.is_end_of_generation('a'));
  EXPECT_EQ(t.token_id("<|im_end|>"), 258);
  EXPECT_EQ(t.token_id("nope"), -1);
}

TEST(ChatTemplate, DefaultSystemMessageFromTemplate) {
  auto v = tiny_vocab({});
  v.chat_template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are Bob, it\\'s fine<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  Tokenizer t(v);
  EXPECT_EQ(t.default_system_message(), "You are Bob, it's fine");
  const std::vector<ChatMessage> user{{"user", "hi"}};
  EXPECT_EQ(t.apply_chat_template(user, true),
            "<|im_start|>system\nYou are Bob, it's fine<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> sys{{"system", "S"}, {"user", "u"}, {"assistant", "a"}};
  EXPECT_EQ(t.apply_chat_template(sys, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
            "<|im_start|>assistant\na<|im_end|>\n");
  EXPECT_EQ(t.apply_chat_template(std::span<const ChatMessage>{}, true),
            "<|im_start|>assistant\n");
  // Without a template there is no default system message.
  Tokenizer plain(tiny_vocab({}));
  EXPECT_EQ(plain.apply_chat_template(user, false), "<|im_start|>user\nhi<|im_end|>\n");
}
