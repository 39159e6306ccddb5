"""autopar/cost"""
