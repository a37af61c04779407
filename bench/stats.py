"""What the benches' ratios share: the median of paired ratios and a confidence interval of it."""
import math


def median_interval(values, coverage=0.9):
    """A distribution-free interval that holds the median of what `values` are drawn from
    with probability >= coverage (or the widest there is): the k-th smallest and k-th largest
    value, k as large as that coverage allows (fewer than k of n values fall below the median
    with probability P(Binomial(n, 1/2) < k))."""
    ordered, n = sorted(values), len(values)
    k = 1
    while k < n // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n >= coverage:
        k += 1
    return ordered[k - 1], ordered[n - k]
