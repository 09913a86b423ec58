// api/metrics.hpp — counters, gauges and histograms rendered in Prometheus'
// text exposition format (version 0.0.4) for GET /metrics.
//
// Debian packages no Prometheus client library for C++; this is the small
// part of one corolla needs. Thread-safe: HTTP handler threads update it
// while a scrape renders it.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace corolla::api {

/// Label names and values of one series, e.g. {{"endpoint", "chat"}}.
using metric_labels = std::vector<std::pair<std::string, std::string>>;

/// A set of metric families and their series.
class metrics_registry {
 public:
  enum class kind { counter, gauge, histogram };

  /// Declares a family (before its first use; a second declaration of the
  /// same name is ignored). `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*;
  /// histogram `buckets` are upper bounds in increasing order (+Inf is
  /// added). Throws std::invalid_argument for a bad name or buckets.
  void declare(const std::string& name, kind k, const std::string& help, std::vector<double> buckets = {});

  /// Adds `value` (>= 0) to a counter, or to a gauge (any sign).
  /// Throws std::invalid_argument for an undeclared name or a kind mismatch.
  void add(const std::string& name, const metric_labels& labels = {}, double value = 1.0);
  /// Sets a gauge.
  void set(const std::string& name, const metric_labels& labels, double value);
  /// Sets a counter from a count kept elsewhere (a value below the last,
  /// read earlier by a concurrent caller, leaves it). Throws
  /// std::invalid_argument for another kind.
  void set_total(const std::string& name, const metric_labels& labels, double value);
  /// Records one observation of a histogram.
  void observe(const std::string& name, const metric_labels& labels, double value);
  /// Sets a histogram series from counts kept elsewhere: per bucket, not
  /// cumulative, in the declared buckets' order (a trailing +Inf count is
  /// ignored: `count` covers it), their sum and number. Throws
  /// std::invalid_argument for fewer counts than buckets.
  void set_histogram(const std::string& name, const metric_labels& labels, const std::vector<double>& bucket_counts,
                     double sum, double count);

  /// The current value of a counter or gauge series (0 when never touched),
  /// for tests and benches.
  double value(const std::string& name, const metric_labels& labels = {}) const;

  /// Every family in the text format: # HELP, # TYPE, then one line per
  /// series (histograms: _bucket{le=...} cumulative, _sum, _count).
  std::string render() const;
  /// The same without the series `hidden` is true of (a counter or gauge
  /// whose every series is hidden shows its zero, as one without series).
  std::string render(const std::function<bool(const metric_labels&)>& hidden) const;

 private:
  struct series {
    double value = 0.0;               ///< counter / gauge
    std::vector<double> bucket_counts; ///< histogram, not cumulative
    double sum = 0.0;
    double count = 0.0;
  };
  struct family {
    kind k = kind::counter;
    std::string help;
    std::vector<double> buckets;
    std::map<metric_labels, series> series_by_labels;
  };
  family& get(const std::string& name, kind k);

  mutable std::mutex mutex_;
  std::map<std::string, family> families_;
};

/// `text` with backslash, double quote and newline escaped as the format
/// wants inside a label value.
std::string escape_label_value(std::string_view text);

}  // namespace corolla::api
