"""autopar/strategies/cube"""
