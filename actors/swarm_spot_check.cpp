// The swarm client's spot checks against wrong servers (actors/swarm_client.hpp;
// the decisions are schedule/spot_check.hpp's). An answer is compared with
// what another server holding the same blocks computes for the same request;
// on a disagreement more servers are asked until a strict majority agrees
// with one answer, and whoever it outvotes is distrusted (never routed
// through again by this client) and reported. Inference sessions check a
// hop by sending its stored inputs for the whole session so far as one
// stateless span.forward; fine-tuning repeats the hop's forward or backward.
// Answers are compared row by row: a forward's checkers also report each
// row's routing margin, and a row of a mixture of experts that a checker
// saw at a routing near tie is excused (two honest servers may choose
// different experts for it; swarm::compare_rows).
#include <algorithm>
#include <sstream>

#include <spdlog/spdlog.h>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/swarm_hop_state.hpp"
#include "actors/swarm_wire.hpp"

namespace corolla {

namespace {

/// The largest prefix an inference check recomputes: span.forward's row limit.
constexpr std::int64_t max_check_rows = 8192;

std::string percent(double x) {
  std::ostringstream s;
  s.precision(3);
  s << x * 100 << "%";
  return s.str();
}

double distance(const Tensor& a, const Tensor& b) {
  return swarm::relative_difference(a.data<float>(), b.data<float>(), static_cast<std::size_t>(a.dim(0)),
                                    static_cast<std::size_t>(a.dim(1)));
}

/// The margins two opinions' rows are compared with: the lower of the two
/// reports, or the one reported.
std::vector<float> lower_margins(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  std::vector<float> m = a;
  for (std::size_t i = 0; i < m.size() && i < b.size(); ++i) m[i] = std::min(a[i], b[i]);
  return m;
}

}  // namespace

caf::expected<spot_opinion> spot_opinion_of(remote_message r, std::int64_t start, std::int64_t n) {
  if (r.tensors.empty() || r.tensors.size() > 2 || r.tensors[0].rank() != 2 || r.tensors[0].dim(0) < start + n)
    return make_error(errc::bad_message, "a forward answered with tensors of other shapes");
  spot_opinion o{r.tensors[0].slice(start, start + n).clone(), {}, {}, {}};
  if (start > 0) o.earlier = r.tensors[0].slice(0, start).clone();
  if (r.tensors.size() == 2) {
    const Tensor& m = r.tensors[1];
    if (m.shape() != shape_t{r.tensors[0].dim(0)} || m.type() != dtype::f32)
      return make_error(errc::bad_message, "a forward answered routing margins of another shape");
    const float* p = m.data<float>();
    o.margins.assign(p + start, p + start + n);
    o.earlier_margins.assign(p, p + start);
  }
  return o;
}

bool swarm_client::should_spot_check(const std::string& node_id) {
  const auto& policy = options_.spot_checks;
  if (policy.fraction <= 0 && policy.probation_steps <= 0) return false;  // checks are off
  const double draw = std::uniform_real_distribution<double>(0.0, 1.0)(spot_rng_);
  // A server others reported wrong is checked on every answer.
  return reported_.count(node_id) > 0 || swarm::should_check(policy, agreed_[node_id], draw);
}

bool swarm_client::spot_check(const swarm::route_hop& hop, const Tensor& answer,
                              const std::function<caf::expected<spot_opinion>(const std::string& server)>& ask,
                              const Tensor& history, std::size_t seq) {
  const known_server* checked = server(hop.server);
  if (!checked || answer.shape().size() != 2 || answer.type() != dtype::f32) return true;
  // Checkers: other servers holding all of the hop's blocks, decoding from
  // the same weights (another format changes the output more than any
  // tolerance that still catches a wrong server), in random order.
  std::vector<const known_server*> checkers;
  for (const auto& s : servers_)
    if (s.reachable && s.node_id != hop.server && !distrusted(s.node_id) && node_.peer_is_up(s.node_id) &&
        s.info.first <= hop.start && hop.end <= s.info.last && s.info.weights == checked->info.weights)
      checkers.push_back(&s);
  std::shuffle(checkers.begin(), checkers.end(), spot_rng_);
  const auto& policy = options_.spot_checks;
  const double tol =
      policy.tolerance > 0 ? policy.tolerance : swarm::spot_check_tolerance(checked->info.weights, options_.compress);
  const double tie = swarm::routing_tie(tol);
  const auto rows = static_cast<std::size_t>(answer.dim(0)), width = static_cast<std::size_t>(answer.dim(1));
  std::vector<Tensor> answers{answer};
  // Routing margins of each answer; the checked server's own are never
  // asked for (a wrong server could excuse itself with them).
  std::vector<std::vector<float>> margins{{}};
  // The earlier rows of the sequence in each opinion (the checked server's:
  // `history`, when known) and their margins (as for the rows).
  std::vector<Tensor> earlier{history};
  std::vector<std::vector<float>> earlier_margins{{}};
  std::size_t excused = 0;  // rows of the checked answer excused against a checker
  std::vector<std::string> who{hop.server};
  std::vector<std::vector<bool>> agree{{true}};
  swarm::spot_verdict verdict;
  for (const known_server* s : checkers) {
    if (static_cast<int>(answers.size()) > policy.max_checkers) break;
    auto z = ask(s->node_id);
    if (!z || z->rows.shape() != answer.shape() || z->rows.type() != dtype::f32 ||
        (!z->margins.empty() && z->margins.size() != rows)) {
      spdlog::debug("swarm: spot check of {} on {} could not use {}: {}", hop.server, to_string(hop.span()),
                    s->node_id, z ? "an answer of another shape" : error_message(z.error()));
      continue;
    }
    // The new answer against every answer so far, row by row.
    const std::size_t k = answers.size();
    agree.push_back(std::vector<bool>(k + 1, true));
    for (std::size_t j = 0; j < k; ++j) {
      // How the sequence's earlier rows compare in these two opinions (the
      // checked server's unknown: any near tie there counts).
      auto before = swarm::earlier_rows::same;
      if (z->earlier.defined()) {
        const Tensor& other = earlier[j];
        const bool known = other.defined() && other.shape() == z->earlier.shape();
        before = swarm::compare_earlier_rows(z->earlier.data<float>(), known ? other.data<float>() : nullptr,
                                             static_cast<std::size_t>(z->earlier.dim(0)), width, tol,
                                             lower_margins(z->earlier_margins, earlier_margins[j]), tie);
      }
      swarm::row_comparison c = swarm::compare_rows(z->rows.data<float>(), answers[j].data<float>(), rows, width, tol,
                                                    lower_margins(z->margins, margins[j]), tie, seq,
                                                    before == swarm::earlier_rows::routed_apart);
      if (before == swarm::earlier_rows::differ) c.agree = false;  // wrong before, where no near tie explains it
      if (j == 0) excused += c.excused;
      agree[k][j] = c.agree;
      agree[j].push_back(c.agree);
    }
    answers.push_back(std::move(z->rows));
    margins.push_back(std::move(z->margins));
    earlier.push_back(std::move(z->earlier));
    earlier_margins.push_back(std::move(z->earlier_margins));
    who.push_back(s->node_id);
    verdict = swarm::judge(agree);
    if (verdict.decided) break;  // (two answers that agree decide at once)
  }
  if (answers.size() == 1) {
    ++spot_stats_.unchecked;
    return true;
  }
  ++spot_stats_.checks;
  if (excused > 0) {
    spot_stats_.excused_rows += excused;
    event("spot check of blocks " + to_string(hop.span()) + ": " + std::to_string(excused) + " row(s) of " +
          hop.server + "'s answer differ beyond the tolerance where a checker's expert routing nearly tied (margin " +
          "below " + percent(tie) + "): not counted against it");
  }
  if (!verdict.decided || !verdict.wrong.empty()) ++spot_stats_.disagreements;
  if (!verdict.decided) {
    ++spot_stats_.undecided;
    event("spot check of blocks " + to_string(hop.span()) + ": " + hop.server + " and " + who[1] +
          " disagree by " + percent(distance(answers[1], answers[0])) + " (tolerance " + percent(tol) +
          ") and no other server decides; both stay in use");
    return true;
  }
  const auto outvoted = [&](std::size_t j) {
    return std::find(verdict.wrong.begin(), verdict.wrong.end(), j) != verdict.wrong.end();
  };
  // Everyone in the majority passed a check.
  for (std::size_t j = 0; j < who.size(); ++j)
    if (!outvoted(j)) ++agreed_[who[j]];
  for (std::size_t w : verdict.wrong) {
    wrong_server_report rep;
    rep.server = who[w];
    if (const known_server* s = server(who[w])) rep.endpoint = s->endpoint;
    rep.start = hop.start;
    rep.end = hop.end;
    rep.tolerance = tol;
    for (std::size_t j = 0; j < who.size(); ++j)
      if (!outvoted(j)) {
        if (rep.majority.empty()) rep.difference = distance(answers[w], answers[j]);
        rep.majority.push_back(who[j]);
      }
    distrusted_.insert(rep.server);
    spot_stats_.wrong.push_back(rep);
    std::string majority;
    for (const auto& m : rep.majority) majority += (majority.empty() ? "" : ", ") + m;
    event("spot check: " + rep.server + " answered blocks " + to_string(hop.span()) + " wrong (off by " +
          percent(rep.difference) + ", tolerance " + percent(tol) + "; " + majority + " agree): it is not used again");
    if (options_.on_wrong_server) options_.on_wrong_server(rep);
  }
  return !outvoted(0);
}

caf::expected<spot_opinion> swarm_session::recompute(const std::string& server, const swarm::route_hop& hop,
                                                     const Tensor& inputs, std::int64_t start, std::int64_t n) {
  remote_message m;
  m.type = span_request::forward;
  m.body = encode_body(span_batch{.batch = 1,
                                  .seq = static_cast<int>(inputs.dim(0)),
                                  .with_prompts = deep_prompts_.defined(),
                                  .first = hop.start,
                                  .last = hop.end,
                                  .with_margins = true,
                                  .adapter = client_.adapter_name()});
  m.tensors.push_back(inputs);
  if (deep_prompts_.defined()) m.tensors.push_back(deep_prompts_.slice(hop.start, hop.end).clone());
  const auto timeout = client_.options().request_timeout * (1 + inputs.dim(0) / 256);
  auto r = client_.runtime().request(server, "span", std::move(m), timeout);
  if (!r) return r.error();
  if (r->tensors.empty() || r->tensors[0].shape() != inputs.shape())
    return make_error(errc::bad_message, "server " + server + " answered a check of " +
                                             std::to_string(inputs.dim(0)) + " rows with tensors of another shape");
  return spot_opinion_of(std::move(*r), start, n);
}

std::size_t swarm_session::check_hops(std::size_t from, const std::vector<Tensor>& outs, std::int64_t start,
                                      std::int64_t n) {
  for (std::size_t i = from; i < hops_.size(); ++i) {
    hop_state& h = hops_[i];
    const std::int64_t D = outs[i].dim(1);
    // The last hop's answers are kept as its history (a rollback cuts them
    // first; a gap leaves them unknown).
    if (i + 1 == hops_.size()) {
      if (h.out_rows > start) {
        h.outputs = {swarm_detail::concat_rows(h.outputs, start, D)};
        h.out_rows = start;
      }
      if (h.out_rows == start) {
        h.outputs.push_back(outs[i].clone());
        h.out_rows = start + n;
      } else {
        h.outputs.clear();
        h.out_rows = -1;
      }
    }
    // A server found wrong as another hop's checker leaves this route too.
    if (client_.distrusted(h.hop.server)) return i;
    if (!client_.should_spot_check(h.hop.server)) continue;
    if (h.rows != start + n || start + n > max_check_rows) continue;
    // The hop's inputs for the whole session so far, recomputed statelessly.
    const Tensor inputs = swarm_detail::concat_rows(h.inputs, start + n, outs[i].dim(1));
    const swarm::route_hop hop = h.hop;
    // What the server answered for the earlier rows: the next hop's inputs,
    // or the last hop's own record.
    Tensor history;
    if (start > 0 && i + 1 < hops_.size() && hops_[i + 1].rows >= start && hops_[i + 1].hop.start == hop.end)
      history = swarm_detail::concat_rows(hops_[i + 1].inputs, start, D);
    else if (start > 0 && i + 1 == hops_.size() && h.out_rows == start + n)
      history = swarm_detail::concat_rows(h.outputs, start, D);
    if (!client_.spot_check(
            hop, outs[i], [&](const std::string& other) { return recompute(other, hop, inputs, start, n); }, history))
      return i;
  }
  return hops_.size();
}

}  // namespace corolla
