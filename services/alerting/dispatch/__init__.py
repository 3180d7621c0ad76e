"""Alert routing, grouping, silencing, inhibition and incident correlation: pure, time passed in."""
