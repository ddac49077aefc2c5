"""placeholder"""
class Gguf:
    name = "gguf"

    def detect(self, ctx):
        return []
