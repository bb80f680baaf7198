using System;
using System.Globalization;
using System.Text;

namespace Virtufin.Worker.Json
{
    /// <summary>A recursive-descent parser for RFC 8259 JSON text.</summary>
    internal sealed class JsonParser
    {
        readonly string s;
        int pos;

        internal JsonParser(string text)
        {
            s = text;
        }

        internal JsonNode ParseDocument()
        {
            SkipWhitespace();
            var value = ParseValue(0);
            SkipWhitespace();
            if (pos < s.Length) throw Unexpected();
            return value;
        }

        JsonException Error(string message)
        {
            return new JsonException(message, pos);
        }

        JsonException Unexpected()
        {
            if (pos >= s.Length) return Error("unexpected end of JSON input");
            char c = s[pos];
            string shown = c < 0x20 || c > 0x7e ? "U+" + ((int)c).ToString("X4", CultureInfo.InvariantCulture) : "'" + c + "'";
            return Error("unexpected character " + shown);
        }

        void SkipWhitespace()
        {
            while (pos < s.Length)
            {
                char c = s[pos];
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
                pos++;
            }
        }

        JsonNode ParseValue(int depth)
        {
            if (pos >= s.Length) throw Unexpected();
            switch (s[pos])
            {
                case '{': return ParseObject(depth + 1);
                case '[': return ParseArray(depth + 1);
                case '"': return JsonValue.Create(ParseString());
                case 't': Literal("true"); return JsonValue.Create(true);
                case 'f': Literal("false"); return JsonValue.Create(false);
                case 'n': Literal("null"); return null;
                default:
                    char c = s[pos];
                    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber();
                    throw Unexpected();
            }
        }

        void Literal(string word)
        {
            if (string.CompareOrdinal(s, pos, word, 0, word.Length) != 0)
            {
                while (word.Length > 0 && pos < s.Length && s[pos] == word[0]) { pos++; word = word.Substring(1); }
                throw Unexpected();
            }
            pos += word.Length;
        }

        void CheckDepth(int depth)
        {
            if (depth > JsonNode.MaxDepth) throw Error("maximum depth " + JsonNode.MaxDepth + " exceeded");
        }

        JsonObject ParseObject(int depth)
        {
            CheckDepth(depth);
            pos++; // '{'
            var obj = new JsonObject();
            SkipWhitespace();
            if (pos < s.Length && s[pos] == '}') { pos++; return obj; }
            while (true)
            {
                SkipWhitespace();
                if (pos >= s.Length || s[pos] != '"') throw Unexpected();
                string key = ParseString();
                SkipWhitespace();
                if (pos >= s.Length || s[pos] != ':') throw Unexpected();
                pos++;
                SkipWhitespace();
                obj[key] = ParseValue(depth); // a repeated name: the last one wins
                SkipWhitespace();
                if (pos >= s.Length) throw Unexpected();
                if (s[pos] == ',') { pos++; continue; }
                if (s[pos] == '}') { pos++; return obj; }
                throw Unexpected();
            }
        }

        JsonArray ParseArray(int depth)
        {
            CheckDepth(depth);
            pos++; // '['
            var array = new JsonArray();
            SkipWhitespace();
            if (pos < s.Length && s[pos] == ']') { pos++; return array; }
            while (true)
            {
                SkipWhitespace();
                array.Add(ParseValue(depth));
                SkipWhitespace();
                if (pos >= s.Length) throw Unexpected();
                if (s[pos] == ',') { pos++; continue; }
                if (s[pos] == ']') { pos++; return array; }
                throw Unexpected();
            }
        }

        string ParseString()
        {
            int start = ++pos; // after '"'
            StringBuilder sb = null;
            while (true)
            {
                if (pos >= s.Length) throw Error("unterminated string");
                char c = s[pos];
                if (c == '"')
                {
                    string tail = s.Substring(start, pos - start);
                    pos++;
                    return sb == null ? tail : sb.Append(tail).ToString();
                }
                if (c < 0x20) throw Error("control character U+" + ((int)c).ToString("X4", CultureInfo.InvariantCulture) + " in string");
                if (c != '\\') { pos++; continue; }
                if (sb == null) sb = new StringBuilder();
                sb.Append(s, start, pos - start);
                pos++;
                if (pos >= s.Length) throw Error("unterminated string");
                switch (s[pos])
                {
                    case '"': sb.Append('"'); break;
                    case '\\': sb.Append('\\'); break;
                    case '/': sb.Append('/'); break;
                    case 'b': sb.Append('\b'); break;
                    case 'f': sb.Append('\f'); break;
                    case 'n': sb.Append('\n'); break;
                    case 'r': sb.Append('\r'); break;
                    case 't': sb.Append('\t'); break;
                    case 'u':
                        int code = 0;
                        for (int i = 1; i <= 4; i++)
                        {
                            if (pos + i >= s.Length) { pos += i; throw Error("unterminated \\u escape"); }
                            int h = HexValue(s[pos + i]);
                            if (h < 0) { pos += i; throw Error("invalid \\u escape"); }
                            code = code * 16 + h;
                        }
                        sb.Append((char)code); // surrogate pairs arrive as two escapes
                        pos += 4;
                        break;
                    default:
                        throw Error("invalid escape '\\" + s[pos] + "'");
                }
                pos++;
                start = pos;
            }
        }

        static int HexValue(char c)
        {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            return -1;
        }

        JsonValue ParseNumber()
        {
            int start = pos;
            if (s[pos] == '-') pos++;
            if (pos < s.Length && s[pos] == '0') pos++;
            else if (!Digits()) throw Unexpected();
            if (pos < s.Length && s[pos] == '.')
            {
                pos++;
                if (!Digits()) throw Unexpected();
            }
            if (pos < s.Length && (s[pos] == 'e' || s[pos] == 'E'))
            {
                pos++;
                if (pos < s.Length && (s[pos] == '+' || s[pos] == '-')) pos++;
                if (!Digits()) throw Unexpected();
            }
            return JsonValue.Number(s.Substring(start, pos - start));
        }

        bool Digits()
        {
            int start = pos;
            while (pos < s.Length && s[pos] >= '0' && s[pos] <= '9') pos++;
            return pos > start;
        }
    }
}
