#include "activekv/route/route.h"

#include <gtest/gtest.h>

#include "activekv/core/error.h"

namespace activekv {
namespace {

using route::ReadFormat;
using route::RouteConfig;
using route::RouteKind;
using route::Segment;

// "e0+4 i4+3 ...": segments as kernel initial (b = bf16, i = int8s), first page, count.
std::string describe(const route::RoutePlan& plan) {
  std::string s;
  for (const Segment& g : plan.segments) {
    s += std::string(g.kernel == route::Kernel::int8s ? "i" : "b") + std::to_string(g.first_page) + "+" +
         std::to_string(g.n_pages) + " ";
  }
  return s;
}

// Page formats as initials: "eeiil..." (e exact, l lossless13, i int8s).
std::string formats(const route::RoutePlan& plan) {
  std::string s;
  for (ReadFormat f : plan.page_format) s += route::format_name(f).substr(0, 1);
  return s;
}

const route::PublishedFn kAll = [](size_t, ReadFormat) { return true; };

TEST(Route, ExactTilesAreFixedSlicesOfThePageTable) {
  RouteConfig c;
  c.tile_pages = 4;
  // 10 pages used (9 full + tail): tiles 0-3, 4-7, 8-9
  EXPECT_EQ(describe(route::plan_route(c, 9 * 16 + 3, 16, kAll)), "b0+4 b4+4 b8+2 ");
}

TEST(Route, HybridKeepsSinkRecentAndTailExact) {
  RouteConfig c{RouteKind::hybrid, 2, 32};
  // 10 full pages + tail: sink 0, middle 1..7 int8s, recent 8,9, tail 10
  const auto plan = route::plan_route(c, 10 * 16 + 5, 16, kAll);
  EXPECT_EQ(describe(plan), "b0+1 i1+7 b8+3 ");
  EXPECT_EQ(formats(plan), "eiiiiiiieee");
  // no tail: recent = pages 8, 9
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16, 16, kAll)), "b0+1 i1+7 b8+2 ");
}

TEST(Route, UnpublishedPagesAreServedExact) {
  RouteConfig c{RouteKind::hybrid, 2, 32};
  auto published = [](size_t p, ReadFormat f) { return f == ReadFormat::int8s && p != 4; };
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16, 16, published)), "b0+1 i1+3 b4+1 i5+3 b8+2 ");
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16, 16, nullptr)), "b0+10 ");
}

TEST(Route, TilesAreFixedSlicesCutWhereTheKernelChanges) {
  RouteConfig c{RouteKind::int8s, 2, 3};
  // int8s route: all full pages compressed, tail exact; tiles [0,3) [3,6) [6,8)
  EXPECT_EQ(describe(route::plan_route(c, 7 * 16 + 1, 16, kAll)), "i0+3 i3+3 i6+1 b7+1 ");
}

TEST(Route, Lossless13SharesTheExactTilesSoResultsMatchBitwise) {
  RouteConfig exact{RouteKind::exact, 2, 4}, l13{RouteKind::lossless13, 2, 4};
  const auto a = route::plan_route(exact, 9 * 16 + 3, 16, kAll);
  const auto b = route::plan_route(l13, 9 * 16 + 3, 16, kAll);
  EXPECT_EQ(describe(a), describe(b));
  EXPECT_EQ(formats(b), "llllllllle");
}

TEST(Route, ShortHistoriesStayExact) {
  RouteConfig c{RouteKind::hybrid, 2, 32};
  EXPECT_EQ(describe(route::plan_route(c, 3 * 16, 16, kAll)), "b0+3 ");
  EXPECT_EQ(describe(route::plan_route(c, 5, 16, kAll)), "b0+1 ");
  EXPECT_TRUE(route::plan_route(c, 0, 16, kAll).segments.empty());
}

TEST(Route, ReportCountsPagesAndTiles) {
  RouteConfig c{RouteKind::hybrid, 2, 4};
  route::RouteReport r;
  r.add(route::plan_route(c, 12 * 16, 16, kAll));
  EXPECT_EQ(r.pages[size_t(ReadFormat::exact)], 3u);
  EXPECT_EQ(r.pages[size_t(ReadFormat::int8s)], 9u);
  EXPECT_EQ(r.segments[size_t(route::Kernel::int8s)], 3u);  // pages 1-3, 4-7, 8 (tiles of 4)
  EXPECT_DOUBLE_EQ(r.compressed_fraction(), 9.0 / 12.0);
  EXPECT_EQ(route::RouteReport{}.compressed_fraction(), 0.0);
}

// A sliding-window layer is read exact on every route (its window stays
// resident on the GPU); a layer over the whole history keeps its route.
TEST(Route, SlidingLayersAreReadExact) {
  for (RouteKind k : {RouteKind::exact, RouteKind::lossless13, RouteKind::int8s, RouteKind::hybrid}) {
    const RouteConfig c{k, 3, 8};
    const RouteConfig global = route::layer_route(c, 0), local = route::layer_route(c, 512);
    EXPECT_EQ(global.kind, k);
    EXPECT_EQ(local.kind, RouteKind::exact);
    EXPECT_EQ(local.recent_pages, 3);
    EXPECT_EQ(local.tile_pages, 8);  // same tiles: the exact route's bits
  }
}

// Route candidates (issue 11 part 5): named parameters of the hybrid split.
TEST(Route, CandidatesCarryNamedParameters) {
  RouteConfig defaults{RouteKind::exact, 2, 4};
  const route::RouteCandidate plain = route::parse_candidate("int8s", defaults);
  EXPECT_EQ(plain.name, "int8s");
  EXPECT_EQ(plain.config.kind, RouteKind::int8s);
  EXPECT_EQ(plain.config.recent_pages, 2);
  EXPECT_EQ(plain.config.tile_pages, 4);
  const route::RouteCandidate c = route::parse_candidate("hybrid:sink=2,recent=3", defaults);
  EXPECT_EQ(c.name, "hybrid:recent=3,sink=2");  // canonical order
  EXPECT_EQ(c.config.recent_pages, 3);
  EXPECT_EQ(c.config.sink_pages, 2);
  // 12 full pages: 2 sink + 3 recent exact, 7 int8s.
  EXPECT_EQ(describe(route::plan_route(c.config, 12 * 16, 16, kAll)), "b0+2 i2+2 i4+4 i8+1 b9+3 ");
  EXPECT_EQ(route::parse_candidate("hybrid:recent=0", defaults).config.recent_pages, 0);
  for (const char* bad : {"hybrid:recent", "hybrid:recent=-1", "hybrid:recent=x", "hybrid:window=2",
                          "hybrid:recent=1,recent=2", "int8s:recent=1", "int4", "hybrid:"})
    EXPECT_THROW(route::parse_candidate(bad, defaults), InvalidArgument) << bad;
}

// `--routes hybrid:recent=8,sink=2,int8s` arrives split at every comma.
TEST(Route, CandidateListsJoinParametersSplitAtCommas) {
  using V = std::vector<std::string>;
  EXPECT_EQ(route::join_candidate_parts({"hybrid:recent=8", "sink=2", "int8s"}), (V{"hybrid:recent=8,sink=2", "int8s"}));
  EXPECT_EQ(route::join_candidate_parts({"lossless13", "hybrid", "hybrid:sink=2", "recent=3"}),
            (V{"lossless13", "hybrid", "hybrid:sink=2,recent=3"}));
  EXPECT_EQ(route::join_candidate_parts({}), V{});
  EXPECT_THROW(route::join_candidate_parts({"sink=2", "int8s"}), InvalidArgument);
  // A joined piece that is no parameter is parse_candidate's to refuse.
  EXPECT_EQ(route::join_candidate_parts({"int8s", "x=1"}), (V{"int8s,x=1"}));
  EXPECT_THROW(route::parse_candidate("int8s,x=1", {}), InvalidArgument);
}

TEST(Route, BadArgumentsAndNames) {
  RouteConfig c;
  EXPECT_THROW(route::plan_route(c, 10, 0, kAll), InvalidArgument);
  c.tile_pages = 0;
  EXPECT_THROW(route::plan_route(c, 10, 16, kAll), InvalidArgument);
  EXPECT_EQ(route::parse_kind("hybrid"), RouteKind::hybrid);
  EXPECT_THROW(route::parse_kind("int4"), InvalidArgument);
}

}  // namespace
}  // namespace activekv
