#include "activekv/route/route.h"

#include <gtest/gtest.h>

#include "activekv/core/error.h"

namespace activekv {
namespace {

using route::ReadFormat;
using route::RouteConfig;
using route::RouteKind;
using route::Segment;

std::string describe(const std::vector<Segment>& segs) {
  std::string s;
  for (const Segment& g : segs) {
    s += route::format_name(g.format).substr(0, 1) + std::to_string(g.first_page) + "+" +
         std::to_string(g.n_pages) + " ";
  }
  return s;
}

const route::PublishedFn kAll = [](size_t, ReadFormat) { return true; };

TEST(Route, ExactTilesAreFixedSlicesOfThePageTable) {
  RouteConfig c;
  c.tile_pages = 4;
  // 10 pages used (9 full + tail): tiles 0-3, 4-7, 8-9
  EXPECT_EQ(describe(route::plan_route(c, 9 * 16 + 3, 16, kAll)), "e0+4 e4+4 e8+2 ");
}

TEST(Route, HybridKeepsSinkRecentAndTailExact) {
  RouteConfig c{RouteKind::hybrid, 2, 32};
  // 10 full pages + tail: sink 0, middle 1..7 int8s, recent 8,9, tail 10
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16 + 5, 16, kAll)), "e0+1 i1+7 e8+3 ");
  // no tail: recent = pages 8, 9
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16, 16, kAll)), "e0+1 i1+7 e8+2 ");
}

TEST(Route, UnpublishedPagesAreServedExact) {
  RouteConfig c{RouteKind::hybrid, 2, 32};
  auto published = [](size_t p, ReadFormat f) { return f == ReadFormat::int8s && p != 4; };
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16, 16, published)), "e0+1 i1+3 e4+1 i5+3 e8+2 ");
  EXPECT_EQ(describe(route::plan_route(c, 10 * 16, 16, nullptr)), "e0+10 ");
}

TEST(Route, CompressedSegmentsSplitIntoTiles) {
  RouteConfig c{RouteKind::int8s, 2, 3};
  // int8s route: all full pages compressed, tail exact
  EXPECT_EQ(describe(route::plan_route(c, 7 * 16 + 1, 16, kAll)), "i0+3 i3+3 i6+1 e7+1 ");
}

TEST(Route, ShortHistoriesStayExact) {
  RouteConfig c{RouteKind::hybrid, 2, 32};
  EXPECT_EQ(describe(route::plan_route(c, 3 * 16, 16, kAll)), "e0+3 ");
  EXPECT_EQ(describe(route::plan_route(c, 5, 16, kAll)), "e0+1 ");
  EXPECT_TRUE(route::plan_route(c, 0, 16, kAll).empty());
}

TEST(Route, ReportCountsPagesAndTiles) {
  RouteConfig c{RouteKind::hybrid, 2, 4};
  route::RouteReport r;
  r.add(route::plan_route(c, 12 * 16, 16, kAll));
  EXPECT_EQ(r.pages[size_t(ReadFormat::exact)], 3u);
  EXPECT_EQ(r.pages[size_t(ReadFormat::int8s)], 9u);
  EXPECT_EQ(r.tiles[size_t(ReadFormat::int8s)], 3u);
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
