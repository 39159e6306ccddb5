"""autopar/strategies/data"""
