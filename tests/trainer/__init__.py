"""Tests of zoo.trainer: task files, rewards and the shipped task set."""
