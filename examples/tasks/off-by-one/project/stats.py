def moving_average(values, window):
    """The average of each run of WINDOW consecutive VALUES, in order."""
    return [sum(values[i:i + window]) / window for i in range(len(values) - window)]
