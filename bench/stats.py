"""What the benches' ratios share: the median of paired ratios and a confidence interval of it."""
import math


def median_interval(values, coverage=0.9):
    """A distribution-free interval that holds the median of what `values` are drawn from
    with probability >= coverage (or the widest there is): the k-th smallest and k-th largest
    value, k as large as that coverage allows (fewer than k of n values fall below the median
    with probability P(Binomial(n, 1/2) < k))."""
    ordered, n = sorted(values), len(values)
    k, below = 1, 1 + n  # below: how many of the 2^n outcomes have at most k values below
    while k < n // 2 and 1 - 2 * below / 2 ** n >= coverage:
        k += 1
        below += math.comb(n, k)  # (summed as it goes: summed anew, 2,000 values took 13 s)
    return ordered[k - 1], ordered[n - k]
