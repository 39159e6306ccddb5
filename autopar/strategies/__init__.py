"""autopar/strategies"""
