def is_leap(year):
    """Whether YEAR is a leap year of the Gregorian calendar."""
    return year % 4 == 0
