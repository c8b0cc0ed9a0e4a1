#include "actors/suffix_index/suffix_drafter.hpp"
#include "actors/suffix_index/suffix_tree.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

using namespace sorl::suffix_index;

namespace {

using tokens = std::vector<std::int32_t>;

node_id find(const suffix_tree& t, const tokens& s) { return t.find(s.data(), s.size()); }

// Occurrences of every substring of length <= depth over the sequences, by brute force.
std::map<tokens, std::int64_t> occurrences(const std::vector<tokens>& seqs, std::int32_t depth) {
  std::map<tokens, std::int64_t> out;
  for (const tokens& s : seqs)
    for (std::size_t i = 0; i < s.size(); ++i)
      for (std::size_t l = 1; l <= static_cast<std::size_t>(depth) && i + l <= s.size(); ++l)
        ++out[tokens(s.begin() + static_cast<std::ptrdiff_t>(i), s.begin() + static_cast<std::ptrdiff_t>(i + l))];
  return out;
}

// Every node's count is its string's occurrences, every substring has a node, and the
// most frequent child is the head; nodes() counts exactly the distinct substrings + root.
void check_index(const suffix_tree& t, const std::vector<tokens>& seqs) {
  const auto occ = occurrences(seqs, t.max_depth());
  REQUIRE(t.nodes() == occ.size() + 1);
  for (const auto& [s, k] : occ) {
    const node_id v = find(t, s);
    REQUIRE(v != no_node);
    REQUIRE(t.count(v) == k);
    REQUIRE(t.depth(v) == static_cast<std::int32_t>(s.size()));
    const tokens tail(s.begin() + 1, s.end());
    REQUIRE(t.link(v) == find(t, tail));
  }
  for (const auto& [s, k] : occ) {
    const node_id v = find(t, s);
    std::int64_t most = 0;
    for (const auto& [s2, k2] : occ)
      if (s2.size() == s.size() + 1 && std::equal(s.begin(), s.end(), s2.begin())) most = std::max(most, k2);
    if (most == 0)
      REQUIRE(t.head_child(v) == no_node);
    else
      REQUIRE(t.count(t.head_child(v)) == most);
  }
}

tokens random_tokens(std::mt19937& rng, std::size_t n, int alphabet) {
  std::uniform_int_distribution<int> tok(0, alphabet - 1);
  tokens s(n);
  for (auto& x : s) x = tok(rng);
  return s;
}

// The reference rule, walking each match length from the root (O(L^2)), ascending, ties to
// the longer match.
draft reference_draft(const suffix_tree& t, const tokens& context, const draft_params& p) {
  draft best;
  for (std::size_t m = 1; m <= context.size() && m <= static_cast<std::size_t>(t.max_depth()); ++m) {
    const tokens suffix(context.end() - static_cast<std::ptrdiff_t>(m), context.end());
    node_id v = find(t, suffix);
    if (v == no_node) break;
    const auto cap = static_cast<std::int32_t>(
        std::clamp(std::floor(static_cast<double>(m) * p.spec_factor + p.spec_offset + 1e-6), 0.0,
                   static_cast<double>(p.max_tokens)));
    draft d;
    d.match_len = static_cast<std::int32_t>(m);
    double prob = 1.0;
    while (static_cast<std::int32_t>(d.tokens.size()) < cap && t.head_child(v) != no_node) {
      const node_id h = t.head_child(v);
      prob *= static_cast<double>(t.count(h)) / static_cast<double>(t.count(v));
      if (prob < p.min_token_prob) break;
      d.tokens.push_back(t.token(h));
      d.score += prob;
      v = h;
    }
    if (d.score >= best.score && d.score > 0) best = d;
  }
  return best;
}

}  // namespace

TEST_CASE("suffix_tree counts links and the draft of a hand-built tree", "[suffix_index]") {
  suffix_tree t(4);
  const tokens s{1, 2, 3, 1, 2, 4, 1, 2, 3};
  t.add_sequence(7, s.data(), s.size());
  CHECK(t.count(find(t, {1, 2})) == 3);
  CHECK(t.count(find(t, {1, 2, 3})) == 2);
  CHECK(t.count(find(t, {1, 2, 4})) == 1);
  CHECK(t.count(find(t, {2, 3, 1, 2})) == 1);
  CHECK(find(t, {1, 2, 3, 1, 2}) == no_node);  // longer than max_depth
  CHECK(t.link(find(t, {1, 2, 3})) == find(t, {2, 3}));
  CHECK(t.head_child(find(t, {1, 2})) == find(t, {1, 2, 3}));
  // The sequence's own tail: its last max_depth - 1 = 3 tokens.
  CHECK(t.tail(7) == find(t, {1, 2, 3}));

  // From "1 2": token 3 with 2/3, then "1 2 3" -> 1 with 2/3 * 1/2 = 1/3; the cap of a
  // 2-token match is 2 tokens; "2" alone (cap 1) cannot beat a score of 1.
  draft d;
  t.best_draft(find(t, {1, 2}), draft_params{}, d);
  CHECK(d.tokens == tokens{3, 1});
  CHECK(d.score == Approx(1.0).epsilon(1e-12));
  CHECK(d.match_len == 2);
  // A probability floor of 0.5 stops after the first token.
  draft_params strict;
  strict.min_token_prob = 0.5;
  t.best_draft(find(t, {1, 2}), strict, d);
  CHECK(d.tokens == tokens{3});
  CHECK(d.score == Approx(2.0 / 3.0).epsilon(1e-12));
  // Nothing matches: an empty draft.
  t.best_draft(suffix_tree::root, draft_params{}, d);
  CHECK(d.tokens.empty());
  CHECK(d.match_len == 0);
  CHECK(d.score == 0.0);

  CHECK_THROWS_AS(t.append(7, -1), std::invalid_argument);
  CHECK_THROWS_AS(t.append(8, 1), std::invalid_argument);
  CHECK_THROWS_AS(t.begin_sequence(7), std::invalid_argument);
  CHECK_THROWS_AS(suffix_tree(0), std::invalid_argument);
}

TEST_CASE("suffix_tree index matches brute-force occurrence counts under insertion and removal",
          "[suffix_index]") {
  std::mt19937 rng(11);
  for (const std::int32_t depth : {1, 3, 6}) {
    suffix_tree t(depth);
    std::vector<tokens> seqs;
    std::vector<suffix_tree::seq_id> ids;
    for (int i = 0; i < 30; ++i) {
      seqs.push_back(random_tokens(rng, 1 + rng() % 20, 3));
      ids.push_back(i);
      t.add_sequence(i, seqs.back().data(), seqs.back().size());
    }
    check_index(t, seqs);
    // Remove every other sequence, then the rest but one: the index is what the survivors
    // alone would build.
    for (std::size_t i = 0; i < seqs.size(); i += 2) t.remove_sequence(ids[i]);
    std::vector<tokens> kept;
    for (std::size_t i = 1; i < seqs.size(); i += 2) kept.push_back(seqs[i]);
    check_index(t, kept);
    for (std::size_t i = 1; i + 2 < seqs.size(); i += 2) t.remove_sequence(ids[i]);
    check_index(t, {seqs[seqs.size() - 1]});
    t.remove_sequence(ids[seqs.size() - 1]);
    CHECK(t.nodes() == 1);
    CHECK(t.live_bytes() == 0);
    CHECK(t.removal_epoch() > 0);
  }
}

TEST_CASE("suffix_tree incremental matching and drafts equal the re-walking reference", "[suffix_index]") {
  std::mt19937 rng(5);
  for (const std::int32_t depth : {4, 16, 32}) {
    suffix_tree t(depth);
    for (int i = 0; i < 40; ++i) {
      const tokens s = random_tokens(rng, 50, 4);
      t.add_sequence(i, s.data(), s.size());
    }
    draft_params p;
    p.max_tokens = 8;
    for (int trial = 0; trial < 20; ++trial) {
      const tokens context = random_tokens(rng, 60, 4);
      node_id cursor = suffix_tree::root;
      for (std::size_t i = 0; i < context.size(); ++i) {
        cursor = t.advance(cursor, context[i]);
        const tokens seen(context.begin(), context.begin() + static_cast<std::ptrdiff_t>(i + 1));
        // The cursor is the longest suffix (<= max_depth) that occurs.
        std::size_t longest = 0;
        for (std::size_t m = std::min<std::size_t>(seen.size(), static_cast<std::size_t>(depth)); m > 0; --m)
          if (find(t, tokens(seen.end() - static_cast<std::ptrdiff_t>(m), seen.end())) != no_node) {
            longest = m;
            break;
          }
        REQUIRE(t.depth(cursor) == static_cast<std::int32_t>(longest));
        draft mine;
        t.best_draft(cursor, p, mine);
        const draft ref = reference_draft(t, seen, p);
        REQUIRE(mine.tokens == ref.tokens);
        REQUIRE(mine.score == Approx(ref.score).epsilon(1e-12));
        if (!ref.tokens.empty()) REQUIRE(mine.match_len == ref.match_len);
      }
    }
  }
}

TEST_CASE("suffix_tree siblings that continue a shared prompt keep counts consistent", "[suffix_index]") {
  suffix_tree t(8);
  const tokens prompt{5, 6, 7};
  t.add_sequence(0, prompt.data(), prompt.size());
  const suffix_tree::seq_id base = 0;
  for (suffix_tree::seq_id s = 1; s <= 3; ++s) t.begin_sequence(s, &base);
  t.append(1, 8);
  t.append(2, 8);
  t.append(3, 9);
  // The prompt's text occurs once per sibling: "7" three times, "6 7" three times.
  CHECK(t.count(find(t, {7})) == 3);
  CHECK(t.count(find(t, {6, 7})) == 3);
  CHECK(t.count(find(t, {5, 6, 7})) == 3);
  CHECK(t.count(find(t, {7, 8})) == 2);
  CHECK(t.count(find(t, {5, 6, 7, 8})) == 2);
  CHECK(t.count(find(t, {7, 9})) == 1);
  CHECK(t.head_child(find(t, {6, 7})) == find(t, {6, 7, 8}));
  // Sibling 3 now drafts what siblings 1 and 2 wrote after the prompt.
  draft d;
  t.best_draft(find(t, {5, 6, 7}), draft_params{}, d);
  CHECK(d.tokens == tokens{8});
  CHECK(d.score == Approx(2.0 / 3.0).epsilon(1e-12));
  CHECK_THROWS_AS(t.remove_sequence(1), std::logic_error);
  CHECK_THROWS_AS(t.remove_sequence(0), std::logic_error);
}

TEST_CASE("suffix_drafter siblings draft for each other and finished responses draft for later groups",
          "[suffix_index]") {
  drafter_options o;
  o.max_depth = 16;
  suffix_drafter dr(o);
  const tokens prompt{1, 2, 3};
  const tokens answer{10, 11, 12, 13, 14, 15};
  dr.start(42, 0, prompt.data(), prompt.size());
  dr.start(42, 1, prompt.data(), prompt.size());
  CHECK(dr.propose(42, 1, 16).tokens.empty());  // empty tree past the prompt
  dr.extend(42, 0, answer.data(), answer.size());
  // After the prompt, sibling 1's context "1 2 3" continued in sibling 0 with 10 11 ...;
  // the match "1 2 3" (3 tokens) allows 3 draft tokens.
  CHECK(dr.propose(42, 1, 16).tokens == tokens{10, 11, 12});
  dr.extend(42, 1, answer.data(), 2);
  const draft& d = dr.propose(42, 1, 2);  // clamped to 2 by the caller
  CHECK(d.tokens == tokens{12, 13});
  dr.finish(42, 0, true);
  dr.finish(42, 1, false);
  CHECK(dr.groups() == 0);
  // A new group whose context ends with 10 11 drafts from the global tree.
  const tokens other{7, 10, 11};
  dr.start(43, 0, other.data(), other.size());
  CHECK(dr.propose(43, 0, 16).tokens == tokens{12, 13});
  const drafter_stats st = dr.take_stats();
  CHECK(st.calls == 4);
  CHECK(st.from_global == 1);
  CHECK(st.global_responses == 1);
  CHECK(st.drafted_tokens == 3 + 2 + 2);
  CHECK_THROWS_AS(dr.propose(44, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(dr.start(43, 0, other.data(), other.size()), std::invalid_argument);
  dr.finish(99, 0, true);  // unknown: ignored
}

TEST_CASE("suffix_drafter global tree stays within its byte bound and evicts oldest first",
          "[suffix_index]") {
  drafter_options o;
  o.max_depth = 8;
  o.global_bytes = 48 << 10;
  suffix_drafter dr(o);
  std::mt19937 rng(3);
  std::vector<tokens> responses;
  const tokens prompt{0};
  std::int64_t evicted = 0;
  for (std::uint64_t g = 0; g < 1500; ++g) {
    responses.push_back(random_tokens(rng, 5 + rng() % 40, 50));
    dr.start(g, 0, prompt.data(), prompt.size());
    dr.extend(g, 0, responses.back().data(), responses.back().size());
    // Drafting while evictions go on keeps working (stale cursors are re-matched).
    (void)dr.propose(g, 0, 4);
    dr.finish(g, 0, true);
    const drafter_stats st = dr.take_stats();
    evicted += st.evicted_responses;
    REQUIRE(st.global_bytes <= o.global_bytes);
  }
  const drafter_stats st = dr.take_stats();
  REQUIRE(evicted > 1000);
  // What is left is exactly the newest responses, as a fresh index of them would hold.
  const std::size_t left = static_cast<std::size_t>(st.global_responses);
  REQUIRE(left + static_cast<std::size_t>(evicted) == responses.size());
  const std::vector<tokens> newest(responses.end() - static_cast<std::ptrdiff_t>(left), responses.end());
  check_index(*dr.global_tree(), newest);
}

TEST_CASE("suffix_drafter responses of other workers draft for running and later samples", "[suffix_index]") {
  drafter_options o;
  o.max_depth = 16;
  suffix_drafter dr(o);
  const tokens context{7, 10, 11};
  // A sample running before the response arrives drafts from it at its next call.
  dr.start(1, 0, context.data(), context.size());
  CHECK(dr.propose(1, 0, 16).tokens.empty());
  const tokens peer{10, 11, 12, 13, 14, 15};
  dr.add_response(peer.data(), peer.size());
  CHECK(dr.propose(1, 0, 16).tokens == tokens{12, 13});
  // A sample started later drafts from it too, as from a finished response of its own.
  dr.start(2, 0, context.data(), context.size());
  const tokens more{10, 11, 12};
  dr.extend(2, 0, more.data() + 2, 1);
  CHECK(dr.propose(2, 0, 16).tokens == tokens{13, 14, 15});
  drafter_stats st = dr.take_stats();
  CHECK(st.added_responses == 1);
  CHECK(st.global_responses == 1);
  CHECK(st.from_global == 2);
  // A negative token is refused before anything is inserted.
  const std::size_t nodes = dr.global_tree()->nodes();
  const tokens bad{20, 21, -1};
  CHECK_THROWS_AS(dr.add_response(bad.data(), bad.size()), std::invalid_argument);
  CHECK(dr.global_tree()->nodes() == nodes);
  dr.add_response(nullptr, 0);  // empty: nothing to index
  st = dr.take_stats();
  CHECK(st.added_responses == 0);
  CHECK(st.global_responses == 1);
  // Without a global tree there is nowhere to put them.
  o.global_bytes = 0;
  suffix_drafter local(o);
  local.add_response(peer.data(), peer.size());
  CHECK(local.global_tree() == nullptr);
  CHECK(local.take_stats().added_responses == 0);
  CHECK_THROWS_AS(local.add_response(bad.data(), bad.size()), std::invalid_argument);
}

TEST_CASE("suffix_drafter responses of other workers count toward the byte bound with its own",
          "[suffix_index]") {
  drafter_options o;
  o.max_depth = 8;
  o.global_bytes = 32 << 10;
  suffix_drafter dr(o);
  std::mt19937 rng(5);
  std::vector<tokens> responses;  // in the order they entered the global tree
  const tokens prompt{0};
  std::int64_t evicted = 0;
  for (std::uint64_t g = 0; g < 600; ++g) {
    responses.push_back(random_tokens(rng, 5 + rng() % 40, 50));
    if (g % 3 == 0) {
      dr.start(g, 0, prompt.data(), prompt.size());
      dr.extend(g, 0, responses.back().data(), responses.back().size());
      dr.finish(g, 0, true);
    } else {
      dr.add_response(responses.back().data(), responses.back().size());
    }
    const drafter_stats st = dr.take_stats();
    evicted += st.evicted_responses;
    REQUIRE(st.global_bytes <= o.global_bytes);
  }
  const drafter_stats st = dr.take_stats();
  REQUIRE(evicted > 300);
  // First in, first out whichever worker generated them.
  const std::size_t left = static_cast<std::size_t>(st.global_responses);
  REQUIRE(left + static_cast<std::size_t>(evicted) == responses.size());
  const std::vector<tokens> newest(responses.end() - static_cast<std::ptrdiff_t>(left), responses.end());
  check_index(*dr.global_tree(), newest);
}
