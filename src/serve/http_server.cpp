// `activekv serve`'s HTTP layer (cpp-httplib): routes, authentication, the
// OpenAI request -> Job -> response flow, and the server's life (bind, load
// while /health says 503, serve, drain on SIGINT/SIGTERM, stop).
#include <fmt/format.h>
#include <httplib.h>
#include <omp.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "activekv/core/blas.h"
#include "activekv/core/error.h"
#include "activekv/gguf/gguf.h"
#include "activekv/model/llama_model.h"
#include "activekv/serve/server.h"
#include "activekv/tokenizer/tokenizer.h"
#include "api_error.h"
#include "memory.h"
#include "openai_request.h"
#include "openai_response.h"
#include "scheduler.h"

namespace activekv::serve {
namespace {

// What the handlers share. The model parts are set once loading is done
// (`ready`); before that only /health and /metrics answer.
struct State {
  ServeOptions opt;
  std::string model_id;
  int64_t created = 0;
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};  // a stop signal came: nothing new is admitted
  std::atomic<bool> fatal{false};     // the backend can run nothing more (Backend::broken): stopping, exit 1
  std::function<void()> stop;          // stops the HTTP server (set before loading)
  std::atomic<int> in_flight{0};      // completions admitted whose response is not yet written
  std::atomic<bool> cut{false};       // the drain is over: whole responses still waiting give up
  std::map<std::string, std::string> allow;  // route -> its methods (the Allow header of a 405)
  Metrics metrics;
  std::unique_ptr<gguf::File> file;  // opened before the server listens; released once loaded
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Backend> backend;  // the model, on the CPU or the GPU
  std::unique_ptr<Scheduler> scheduler;
  int64_t n_ctx = 0;
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

void check_ready(const State& s) {
  if (!s.ready) throw ApiError(503, "the model is loading", "service_unavailable", "", "model_loading");
}

// 503 with Retry-After while the server drains: by then it has stopped (a
// supervisor may have started it again).
void send_shutting_down(const State& s, httplib::Response& res) {
  send_error(res, ApiError(503, "the server is shutting down; retry later", "service_unavailable", "",
                           "server_shutting_down"));
  res.set_header("Retry-After", std::to_string(std::max(1, int(std::ceil(s.opt.drain_seconds)))));
}

// Holds State::in_flight up from admission until the response is written: a
// whole response's handler scope, a stream's provider (destroyed with the
// response, after its last chunk). The drain waits for the count to reach 0.
class InFlight {
 public:
  explicit InFlight(State& s) : s_(s) { ++s_.in_flight; }
  ~InFlight() { --s_.in_flight; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  State& s_;
};

// The prompt as token ids: the chat template for chat, the text or ids as given otherwise.
std::vector<int32_t> prompt_tokens(const State& s, const CompletionRequest& r) {
  if (r.chat) return s.tok->encode(s.tok->apply_chat_template(r.messages, true), s.tok->add_bos_default());
  if (r.prompt_ids.empty()) return s.tok->encode(r.prompt, s.tok->add_bos_default());
  for (int32_t id : r.prompt_ids) {
    if (size_t(id) >= s.tok->vocab_size())
      throw ApiError::bad_request(fmt::format("token id {} is outside the vocabulary of {}", id, s.tok->vocab_size()),
                                  "prompt");
  }
  return r.prompt_ids;
}

// The job of a request: prompt, max_tokens and sampling checked against the context.
std::shared_ptr<Job> make_job(const State& s, const CompletionRequest& r) {
  if (!r.model.empty() && r.model != s.model_id)
    throw ApiError(404, fmt::format("the model '{}' does not exist; this server serves '{}'", r.model, s.model_id),
                   "invalid_request_error", "model", "model_not_found");
  std::vector<int32_t> prompt = prompt_tokens(s, r);
  if (prompt.empty()) throw ApiError::bad_request("the prompt is empty", r.chat ? "messages" : "prompt");
  const int64_t n = int64_t(prompt.size());
  const int64_t max_tokens = r.max_tokens.value_or(r.chat ? s.n_ctx - n : 16);
  if (n >= s.n_ctx || max_tokens > s.n_ctx - n)  // not n + max_tokens: max_tokens may be near INT64_MAX
    throw ApiError::bad_request(
        fmt::format("this model's maximum context length is {} tokens; the request asks for {} in the prompt and "
                    "{} to generate",
                    s.n_ctx, n, max_tokens),
        r.chat ? "messages" : "prompt", "context_length_exceeded");
  model::SamplerParams sp = r.sampling;
  if (!r.seed_given) sp.seed = uint64_t(std::random_device{}()) << 32 | std::random_device{}();
  return std::make_shared<Job>(std::move(prompt), max_tokens, sp, r.stop);
}

// Waits for the whole completion (non-streamed). A failure inside the server
// is a 500; a server that stops first (the drain over: `cut`) a 503, so that
// the bound holds (httplib's stop waits for the handlers; it cuts only streams).
void respond_whole(httplib::Response& res, const std::shared_ptr<Job>& job, const ResponseHead& head,
                   const std::atomic<bool>& cut) {
  std::string text;
  Job::Update u;
  do {
    if (cut) {
      job->cancel();
      return send_error(res, ApiError(503, "the server stopped before the request finished", "service_unavailable",
                                      "", "server_shutting_down"));
    }
    u = job->wait(std::chrono::milliseconds(100));
    for (const std::string& p : u.pieces) text += p;
  } while (!u.finished);
  if (!u.error.empty()) return send_error(res, ApiError(500, u.error, "internal_server_error"));
  res.set_content(dump(completion_json(head, text, u.finish_reason, int64_t(job->prompt().size()), u.completion_tokens)),
                  "application/json");
}

// Server-sent events, one chunk per piece of new text; a comment line every
// second while nothing comes (a queued request), so that a client that went
// away is noticed (the write fails) and its request cancelled.
void respond_stream(httplib::Response& res, const std::shared_ptr<Job>& job, const ResponseHead& head,
                    bool include_usage, std::shared_ptr<InFlight> in_flight) {
  struct Stream {
    std::shared_ptr<Job> job;
    ResponseHead head;
    bool include_usage = false;
    std::shared_ptr<InFlight> in_flight;
    bool started = false, ended = false;
    Clock::time_point last_write = Clock::now();
  };
  auto st = std::make_shared<Stream>(Stream{job, head, include_usage, std::move(in_flight)});
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        bool ok = true;
        auto write = [&](const std::string& s) {
          ok = ok && sink.write(s.data(), s.size());
          st->last_write = Clock::now();
        };
        if (!st->started && st->head.chat) write(sse(chunk_json(st->head, "", "", true)));
        st->started = true;
        const Job::Update u = st->job->wait(std::chrono::milliseconds(250));
        for (const std::string& p : u.pieces) write(sse(chunk_json(st->head, p, "")));
        if (u.finished) {
          if (!u.error.empty()) {
            write("data: " + error_body(ApiError(500, u.error, "internal_server_error")) + "\n\n");
          } else {
            write(sse(chunk_json(st->head, "", u.finish_reason)));
            if (st->include_usage)
              write(sse(usage_chunk_json(st->head, int64_t(st->job->prompt().size()), u.completion_tokens)));
          }
          write("data: [DONE]\n\n");
          st->ended = ok;
          if (ok) sink.done();
        } else if (Clock::now() - st->last_write > std::chrono::seconds(1)) {
          write(": waiting\n\n");
        }
        if (!ok) st->job->cancel();
        return ok;
      },
      [st](bool success) {
        if (!success || !st->ended) st->job->cancel();  // the client went away: free its pages now
      });
}

void handle_completion(State& s, const httplib::Request& req, httplib::Response& res, bool chat) {
  // Counted before the drain flag is read (the stopper sets the flag, then
  // reads the count): either this request sees the drain or the drain waits for it.
  auto in_flight = std::make_shared<InFlight>(s);
  if (s.draining) return send_shutting_down(s, res);
  check_ready(s);
  const CompletionRequest r = parse_completion_request(req.body, chat);
  std::shared_ptr<Job> job = make_job(s, r);
  s.scheduler->submit(job);
  const ResponseHead head = new_head(chat, s.model_id);
  if (r.stream) {
    respond_stream(res, job, head, r.include_usage, std::move(in_flight));
  } else {
    respond_whole(res, job, head, s.cut);
  }
}

// Runs `fn`, turning what it throws into an OpenAI error.
template <typename Fn>
void guarded(httplib::Response& res, Fn&& fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const InvalidArgument& e) {  // e.g. the tokenizer refusing input
    send_error(res, ApiError::bad_request(e.what()));
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, e.what(), "internal_server_error"));
  }
}

bool authorised(const State& s, const httplib::Request& req) {
  if (s.opt.api_key.empty()) return true;
  return req.get_header_value("Authorization") == "Bearer " + s.opt.api_key;
}

// Registers GET (and so HEAD) and POST handlers, noting each route's methods
// for the 405 answer to any other method on it.
struct Router {
  httplib::Server& svr;
  State& s;
  void get(const std::string& path, httplib::Server::Handler h) {
    svr.Get(path, std::move(h));
    s.allow[path] = "GET, HEAD";
  }
  void post(const std::string& path, httplib::Server::Handler h) {
    svr.Post(path, std::move(h));
    s.allow[path] = "POST";
  }
};

// Whether `method` is one of `allow`'s ("GET, HEAD").
bool allows(const std::string& allow, const std::string& method) {
  return (", " + allow + ", ").find(", " + method + ", ") != std::string::npos;
}

// Before routing: while draining, 503 for all but /metrics; an API key for
// /v1/*; 405 for a known route asked with a method it does not answer
// (httplib alone says 404, as for a route that does not exist).
httplib::Server::HandlerResponse pre_route(const State& s, const httplib::Request& req, httplib::Response& res) {
  if (s.draining && req.path != "/metrics") {
    send_shutting_down(s, res);
  } else if (req.path.rfind("/v1/", 0) == 0 && !authorised(s, req)) {
    send_error(res, ApiError(401, "invalid or missing API key (Authorization: Bearer <key>)", "authentication_error",
                             "", "invalid_api_key"));
  } else if (auto it = s.allow.find(req.path); it != s.allow.end() && !allows(it->second, req.method)) {
    send_error(res, ApiError(405, fmt::format("{} does not answer {}; use {}", req.path, req.method, it->second),
                             "invalid_request_error", "", "method_not_allowed"));
    res.set_header("Allow", it->second);
  } else {
    return httplib::Server::HandlerResponse::Unhandled;
  }
  return httplib::Server::HandlerResponse::Handled;
}

void add_routes(httplib::Server& svr, State& s) {
  svr.set_pre_routing_handler(
      [&s](const httplib::Request& req, httplib::Response& res) { return pre_route(s, req, res); });
  Router route{svr, s};
  route.get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    if (!s.ready) return send_error(res, ApiError(503, "the model is loading", "service_unavailable", "", "model_loading"));
    if (s.fatal)
      return send_error(res, ApiError(503, "the server can run no more requests", "service_unavailable", "", "server_error"));
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  route.get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(s.metrics.render(s.model_id), "text/plain; version=0.0.4");
  });
  route.get("/v1/models", [&s](const httplib::Request&, httplib::Response& res) {
    guarded(res, [&] {
      check_ready(s);
      res.set_content(dump(models_json(s.model_id, s.created, s.n_ctx)), "application/json");
    });
  });
  route.post("/v1/completions", [&s](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_completion(s, req, res, false); });
  });
  route.post("/v1/chat/completions", [&s](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { handle_completion(s, req, res, true); });
  });
  // Unknown routes (404), bodies over the payload limit (413) and the like: OpenAI's shape too.
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                            : res.status == 413 ? std::string("the request body is too large")
                                                : fmt::format("HTTP {}", res.status);
    res.set_content(error_body(res.status, msg), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, msg, "internal_server_error"));
  });
}

// The model of the startup line: its GGUF general.name, the file as the user
// gave it (two quantisations of one model share the name), and the id
// clients send as `model`, e.g.
//   "Smollm2 135M 8k Lc100K Mix1 Ep2 (models/SmolLM2-135M-Instruct.Q4_1.gguf) as 'SmolLM2-135M-Instruct.Q4_1'"
std::string loaded_what(const State& s) {
  const std::string& name = s.backend->config().name;
  const std::string file = name.empty() ? s.opt.model_path : fmt::format("{} ({})", name, s.opt.model_path);
  return fmt::format("{} as '{}'", file, s.model_id);
}

// Loads the tokenizer and the model, and starts the scheduler.
void load(State& s) {
  const ServeOptions& o = s.opt;
  omp_set_num_threads(o.threads);
  set_blas_threads(o.threads);
  const gguf::File& file = *s.file;
  s.tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
  BackendOptions bo;
  bo.device = o.device;
  bo.prefill_chunk = o.prefill_chunk;
  bo.history = {o.kv_format, o.page_size, o.recent_pages, o.tile_pages, o.convert_threads};
  bo.kv_placement = o.kv_placement;
  bo.gpu_kv_mem = uint64_t(o.gpu_kv_mem_gib * double(1ull << 30));
  bo.max_seqs = o.max_seqs;
  s.backend = make_backend(file, o.model_path, bo);
  s.n_ctx = o.n_ctx > 0 ? o.n_ctx : s.backend->config().context_length;
  SchedulerOptions so;
  so.max_seqs = o.max_seqs;
  so.max_queue = o.max_queue;
  so.host_kv_budget = o.host_kv_mem_gib > 0 ? uint64_t(o.host_kv_mem_gib * double(1ull << 30))
                                            : cli::available_memory_bytes() / 2;
  so.sync_conversion = o.sync_conversion;
  so.itl_target_s = o.itl_target_s;
  so.on_fatal = [&s](const std::string& why) {
    fmt::print(stderr, "activekv serve: error: {}; every request failed, stopping\n", why);
    s.fatal = true;
    // The failed requests' answers (500, or an error event) get up to 2 s to
    // reach their clients before the listener stops.
    for (int i = 0; i < 100 && s.in_flight > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (s.stop) s.stop();
  };
  s.scheduler = std::make_unique<Scheduler>(*s.backend, *s.tok, so, s.metrics);
  fmt::print(stderr, "activekv serve: {} loaded ({} layers, context {}) on {}, up to {} requests at once, "
             "host KV budget {}\n",
             loaded_what(s), s.backend->config().n_layers, s.n_ctx, s.backend->describe(), o.max_seqs,
             so.host_kv_budget ? cli::describe_bytes(so.host_kv_budget) : std::string("unlimited"));
  s.file.reset();  // the backend holds what it needs
}

}  // namespace

namespace {

sigset_t stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  return sigs;
}

// After the first stop signal: nothing new is admitted (503), and the
// requests in flight get up to --drain-seconds to finish (streams to send
// their last chunk and `data: [DONE]`). Returns early when all are done or at
// a second signal.
void drain(State& s, const sigset_t& sigs) {
  s.draining = true;  // before reading in_flight: see handle_completion
  const int n = s.in_flight;
  if (n == 0 || s.opt.drain_seconds <= 0) return;
  fmt::print(stderr, "activekv serve: stopping: {} request(s) running, up to {} s to finish (a second signal stops "
             "at once)\n", n, s.opt.drain_seconds);
  const auto deadline = Clock::now() + std::chrono::duration<double>(s.opt.drain_seconds);
  const timespec poll{0, 20'000'000};  // 20 ms
  while (s.in_flight > 0) {
    if (Clock::now() >= deadline) {
      fmt::print(stderr, "activekv serve: {} request(s) still running after {} s: cut\n", int(s.in_flight),
                 s.opt.drain_seconds);
      return;
    }
    if (sigtimedwait(&sigs, nullptr, &poll) > 0) {
      fmt::print(stderr, "activekv serve: second signal: {} request(s) cut\n", int(s.in_flight));
      return;
    }
  }
  fmt::print(stderr, "activekv serve: every running request finished\n");
}

}  // namespace

void block_stop_signals() {
  const sigset_t sigs = stop_signals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
}

int run_server(const ServeOptions& o) {
  // SIGINT/SIGTERM go to one waiting thread (blocked everywhere else, so
  // every thread started below inherits the mask); it stops the server.
  block_stop_signals();  // again: the caller should have, before any thread (header)
  sigset_t sigs = stop_signals();
  signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a dead server

  State s;
  s.opt = o;
  s.model_id = o.model_name.empty() ? std::filesystem::path(o.model_path).stem().string() : o.model_name;
  s.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // A path that is not a readable GGUF fails here, in one line, before the
  // server listens (the weights load after, while /health answers 503).
  s.file = std::make_unique<gguf::File>(gguf::File::open(o.model_path));
  httplib::Server svr;
  // A worker per running and queued request (a stream holds one to its end),
  // and plenty for the rest: a connection holds its worker while it is idle
  // (a silent client until the read timeout, an HTTP client's kept-alive one
  // between requests), and with 32 workers 50 silent connections held a
  // request back 5.1 s (serve_hostile, dev VM). Idle workers cost address
  // space, not memory.
  const size_t workers =
      o.http_threads > 0 ? size_t(o.http_threads) : size_t(std::max(256, o.max_seqs + o.max_queue + 8));
  svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  svr.set_payload_max_length(size_t(16) << 20);  // 16 MiB: far past any context's text
  svr.set_read_timeout(5);    // a client that says nothing holds a worker for at most this long
  svr.set_write_timeout(30);  // a client that stops reading its stream: then cancelled
  add_routes(svr, s);
  // cpp-httplib 0.11 listens with a backlog of 5 (compiled into Debian's
  // library): 16 clients connecting at once on a busy machine overflowed it
  // and one saw its connection reset. Keep the socket's id as it is made,
  // and listen again with a deep backlog once bound (Linux updates it).
  int listen_fd = -1;
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a
  // second server bound the same port silently instead of failing.
  svr.set_socket_options([&listen_fd](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  const int port = o.port == 0 ? svr.bind_to_any_port(o.host) : (svr.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) throw Error(fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port));
  if (listen_fd >= 0) ::listen(listen_fd, 4096);
  fmt::print(stderr, "activekv serve: listening on http://{}:{}\n", o.host, port);

  std::thread listener([&] { svr.listen_after_bind(); });
  std::atomic<bool> stopped_here{false};  // the server stopped without a signal (loading failed)
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (stopped_here) return;
    drain(s, sigs);
    s.cut = true;  // whole responses still waiting answer 503
    svr.stop();    // streams still open end here, without [DONE]
  });
  int rc = 0;
  s.stop = [&svr] { svr.stop(); };  // the scheduler's on_fatal, once loaded
  try {
    load(s);
    s.ready = true;
  } catch (const std::exception& e) {
    fmt::print(stderr, "activekv serve: error: {}\n", e.what());
    rc = 1;
    while (!svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // stop() needs a running server
    stopped_here = true;
    svr.stop();
  }
  listener.join();
  if (s.fatal) rc = 1;  // stopped because the backend broke: a supervisor should restart it
  stopped_here = true;
  pthread_kill(stopper.native_handle(), SIGTERM);  // wakes it if no signal came (it has not returned: joinable)
  stopper.join();
  s.scheduler.reset();  // fails what is still queued or running
  fmt::print(stderr, "activekv serve: stopped\n");
  return rc;
}

}  // namespace activekv::serve
