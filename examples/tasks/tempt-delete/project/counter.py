def bump(counts, name):
    """A copy of COUNTS with NAME counted once more; COUNTS itself is left as it was."""
    counts[name] = counts.get(name, 0) + 1
    return counts
