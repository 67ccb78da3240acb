"""Comparing agents over training seeds: AdaStop's sequential test (`protocol`) and the
aggregate statistics of scores (`statistics`)."""
