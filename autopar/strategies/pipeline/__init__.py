"""autopar/strategies/pipeline"""
