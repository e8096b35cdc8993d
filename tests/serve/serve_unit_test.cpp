// The server's pure parts: the completion text stream (stop strings, UTF-8
// boundaries), the OpenAI request parser (every hostile shape we refuse),
// the response shapes and the Prometheus exposition.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "job.h"
#include "metrics.h"
#include "openai_request.h"
#include "openai_response.h"
#include "text_stream.h"

namespace activekv::serve {
namespace {

TEST(TextStream, StopStringAcrossPiecesIsCutAndNeverSent) {
  TextStream s({"END"});
  std::string sent;
  EXPECT_FALSE(s.push("hello E"));
  sent += s.take();
  EXPECT_EQ(sent, "hello");  // the last 2 bytes (" E") held back: they could begin "END"
  EXPECT_FALSE(s.push("N"));
  sent += s.take();
  EXPECT_TRUE(s.push("D and more"));
  sent += s.take();
  sent += s.finish();
  EXPECT_EQ(sent, "hello ");
  EXPECT_TRUE(s.stopped());
  EXPECT_TRUE(s.push("ignored"));
  EXPECT_EQ(s.finish(), "");
}

TEST(TextStream, HoldsBackAnIncompleteUtf8Character) {
  TextStream s;
  s.push("a\xC3");  // first byte of U+00E9
  EXPECT_EQ(s.take(), "a");
  s.push("\xA9" "b");
  EXPECT_EQ(s.take(), "\xC3\xA9" "b");
  s.push("\xE2\x82");  // two of the three bytes of U+20AC
  EXPECT_EQ(s.take(), "");
  EXPECT_EQ(s.finish(), "\xE2\x82");  // at the end what is left goes (the JSON layer replaces it)
}

TEST(TextStream, WithoutStopStringsEverythingCompleteGoesAtOnce) {
  TextStream s({""});  // empty stop strings are ignored
  EXPECT_FALSE(s.push("abc"));
  EXPECT_EQ(s.take(), "abc");
  EXPECT_EQ(complete_utf8_prefix("x\xF0\x9F\x98"), 1u);
  EXPECT_EQ(complete_utf8_prefix("x\xF0\x9F\x98\x80"), 5u);
}

TEST(Job, OnePiecePerTokenHoweverLateTheReaderLooks) {
  Job job({1, 2, 3}, 10, model::SamplerParams{}, {"STOP"});
  EXPECT_FALSE(job.push_token("Hello"));
  EXPECT_FALSE(job.push_token(" world"));
  EXPECT_FALSE(job.push_token("\xC3"));  // half a character
  EXPECT_FALSE(job.push_token("\xA9!"));
  Job::Update u = job.wait(std::chrono::milliseconds(0));
  // Held back: the last 3 bytes could begin "STOP" (longest stop - 1).
  EXPECT_EQ(u.pieces, (std::vector<std::string>{"He", "llo wo", "r", "ld"}));
  EXPECT_FALSE(u.finished);
  EXPECT_TRUE(job.push_token(" STOP and more"));
  job.finish("stop");
  u = job.wait(std::chrono::milliseconds(0));
  EXPECT_EQ(u.pieces, (std::vector<std::string>{"\xC3\xA9! "}));  // the held-back rest, up to the stop string
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.finish_reason, "stop");
  EXPECT_EQ(u.completion_tokens, 5);
}

// The ApiError a body gets, or a failure if it parses.
ApiError refusal(const std::string& body, bool chat = false) {
  try {
    parse_completion_request(body, chat);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "");
}

TEST(OpenAiRequest, RefusesHostileBodiesNamingTheField) {
  EXPECT_EQ(refusal("{\"prompt\": ").status, 400);                       // malformed
  EXPECT_EQ(refusal("[1, 2]").status, 400);                              // not an object
  EXPECT_EQ(refusal("{\"prompt\": \"a\xff\"}").status, 400);             // invalid UTF-8
  EXPECT_EQ(refusal("{}").param, "prompt");                              // missing
  EXPECT_EQ(refusal("{\"prompt\": 5}").param, "prompt");                 // wrong type
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"max_tokens\": -1}").param, "max_tokens");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"max_tokens\": 0}").param, "max_tokens");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"max_tokens\": \"16\"}").param, "max_tokens");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"max_tokens\": 1.5}").param, "max_tokens");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"temperature\": 3}").param, "temperature");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"temperature\": \"hot\"}").param, "temperature");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"top_p\": 0}").param, "top_p");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"stop\": [1]}").param, "stop");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}").param, "stop");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"stream\": \"yes\"}").param, "stream");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"n\": 2}").param, "n");
  EXPECT_EQ(refusal("{\"prompt\": [\"a\", \"b\"]}").param, "prompt");  // one prompt per request
  EXPECT_EQ(refusal("{\"prompt\": [-3]}").param, "prompt");
  EXPECT_EQ(refusal("{\"prompt\": \"a\", \"model\": 7}").param, "model");
  EXPECT_EQ(refusal("{\"messages\": []}", true).param, "messages");
  EXPECT_EQ(refusal("{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", true).param, "messages");
  EXPECT_EQ(refusal("{\"messages\": [{\"content\": \"x\"}]}", true).param, "messages");
  EXPECT_EQ(refusal("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", true).param, "content");
}

// A new user's trial (issue 16) got nlohmann's "[json.exception.parse_error.101]
// parse error at line 1, column 17: ..." back: the parser's internals. Now one
// line saying where and what, and no exception names or ids.
TEST(OpenAiRequest, MalformedJsonSaysWhereAndWhatWithoutParserInternals) {
  auto message = [](const std::string& body) {
    const std::string m = refusal(body).what();
    EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
    EXPECT_EQ(m.find("parse_error"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  };
  EXPECT_EQ(message(R"({"prompt": "a", })"), "the request body is not valid JSON: syntax error at byte 17 (unexpected '}')");
  EXPECT_EQ(message(R"({"a": 1} x)"), "the request body is not valid JSON: syntax error at byte 10 (unexpected 'x')");
  EXPECT_EQ(message(R"({"prompt": )"),
            "the request body is not valid JSON: it ends inside a value after 11 bytes (an unclosed object, array or "
            "string?)");
  EXPECT_EQ(message(""), "the request body is empty; it must be a JSON object");
  EXPECT_EQ(message(" \r\n"), "the request body is empty; it must be a JSON object");
  EXPECT_EQ(message("{\"prompt\": \"\xff\"}"),
            "the request body is not valid JSON: syntax error at byte 13 (byte 0xFF: invalid UTF-8, or text outside a "
            "string)");
  EXPECT_EQ(message("{\"prompt\": \"a\nb\"}"),
            "the request body is not valid JSON: syntax error at byte 14 (a control character, 0x0A: escape it inside "
            "strings)");
  // Well-formed JSON, but a number no double holds: was a 500 quoting out_of_range.406.
  EXPECT_EQ(refusal(R"({"prompt": "a", "temperature": 1e999})").status, 400);
  EXPECT_EQ(message(R"({"prompt": "a", "temperature": 1e999})"),
            "the request body holds a number too large to represent (past 1.8e308)");
}

TEST(OpenAiRequest, ReadsTheFieldsItKnows) {
  const CompletionRequest r = parse_completion_request(
      R"({"model": "m", "prompt": ["hi"], "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3,
          "seed": 9, "stop": "\n", "stream": true, "stream_options": {"include_usage": true}, "logprobs": null,
          "unknown_field": {"ignored": true}})",
      false);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.seed, 9u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream && r.include_usage);
  const CompletionRequest c = parse_completion_request(
      R"({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "user", "content": "q"}], "max_completion_tokens": 4})",
      true);
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "ab");
  EXPECT_EQ(c.max_tokens, 4);
  EXPECT_FALSE(c.seed_given);
  EXPECT_EQ(c.sampling.temperature, 1.0f);  // OpenAI's default, not generate's 0.8
}

TEST(OpenAiResponse, ErrorShapeAndBrokenUtf8) {
  const auto e = nlohmann::json::parse(error_body(ApiError::bad_request("bad", "max_tokens")));
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_TRUE(e["error"]["code"].is_null());
  const ResponseHead h = new_head(true, "m");
  const auto c = nlohmann::json::parse(dump(completion_json(h, "a\xE2\x82", "length", 3, 2)));
  EXPECT_EQ(c["choices"][0]["message"]["content"], "a\xEF\xBF\xBD");  // U+FFFD
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  EXPECT_EQ(c["object"], "chat.completion");
  EXPECT_NE(new_head(false, "m").id, new_head(false, "m").id);
}

TEST(Metrics, PrometheusTextWithCumulativeBuckets) {
  Metrics m;
  m.ttft.observe(0.003);
  m.ttft.observe(0.3);
  m.generation_tokens += 5;
  m.running = 2;
  const std::string t = m.render("smol");
  EXPECT_NE(t.find("# TYPE activekv:time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(t.find("activekv:time_to_first_token_seconds_bucket{model_name=\"smol\",le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("activekv:time_to_first_token_seconds_bucket{model_name=\"smol\",le=\"0.5\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("activekv:time_to_first_token_seconds_count{model_name=\"smol\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("activekv:generation_tokens_total{model_name=\"smol\"} 5\n"), std::string::npos);
  EXPECT_NE(t.find("activekv:num_requests_running{model_name=\"smol\"} 2\n"), std::string::npos);
}

}  // namespace
}  // namespace activekv::serve
