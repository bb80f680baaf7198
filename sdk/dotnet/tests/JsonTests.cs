using System;
using System.Collections.Generic;
using System.Linq;
using Virtufin.Worker.Json;

namespace Virtufin.Worker.Tests
{
    static class JsonTests
    {
        [Test]
        static void ParsesLiterals()
        {
            Assert.Equal(true, JsonNode.Parse("true").GetValue<bool>());
            Assert.Equal(false, JsonNode.Parse(" false ").GetValue<bool>());
            Assert.Null(JsonNode.Parse("null"), "JSON null is C# null");
            Assert.Null(JsonNode.Parse("[null]")[0]);
            Assert.Equal("abc", JsonNode.Parse("\"abc\"").GetValue<string>());
            Assert.Equal("[1,2]", JsonNode.Parse(" \t\n\r[ 1 ,\n 2 ]\r\n").ToJsonString());
        }

        [Test]
        static void ParsesEscapes()
        {
            var s = JsonNode.Parse("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u00E9\"").GetValue<string>();
            Assert.Equal("\"\\/\b\f\n\r\tAéé", s);
        }

        [Test]
        static void WritesEscapes()
        {
            JsonNode node = "q\" b\\ /\b\f\n\r\t\u0001\u001f\u007f\u2028é";
            Assert.Equal("\"q\\\" b\\\\ /\\b\\f\\n\\r\\t\\u0001\\u001f\u007f\\u2028é\"", node.ToJsonString());
            Assert.Equal(node.GetValue<string>(), JsonNode.Parse(node.ToJsonString()).GetValue<string>(), "round trip");
        }

        [Test]
        static void Unicode()
        {
            var s = JsonNode.Parse("\"\\ud83d\\ude00 \\uD83D\\uDE00 😀\"").GetValue<string>();
            Assert.Equal("😀 😀 😀", s);
            Assert.Equal(0x1F600, char.ConvertToUtf32(s, 0));
            JsonNode smiley = "😀 日本";
            Assert.Equal("\"😀 日本\"", smiley.ToJsonString(), "pairs and BMP characters are written as they are");
            JsonNode lone = "a\ud800b\udc00";
            Assert.Equal("\"a\\ud800b\\udc00\"", lone.ToJsonString(), "lone surrogates are escaped");
            Assert.Equal("a\ud800b\udc00", JsonNode.Parse(lone.ToJsonString()).GetValue<string>());
        }

        [Test]
        static void Integers()
        {
            Assert.Equal(0, JsonNode.Parse("0").GetValue<int>());
            Assert.Equal(0, JsonNode.Parse("-0").GetValue<int>());
            Assert.Equal(-42, JsonNode.Parse("-42").GetValue<int>());
            Assert.Equal(long.MaxValue, JsonNode.Parse("9223372036854775807").GetValue<long>());
            Assert.Equal(long.MinValue, JsonNode.Parse("-9223372036854775808").GetValue<long>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("2147483648").GetValue<int>(), "beyond int");
            Assert.Equal(2147483648L, JsonNode.Parse("2147483648").GetValue<long>());
            Assert.Equal(42.0, JsonNode.Parse("42").GetValue<double>());
            Assert.Equal(42m, JsonNode.Parse("42").GetValue<decimal>());
        }

        [Test]
        static void BigIntegersKeepTheirText()
        {
            var big = JsonNode.Parse("[9223372036854775808,123456789012345678901234567890123]");
            Assert.Equal("[9223372036854775808,123456789012345678901234567890123]", big.ToJsonString());
            Assert.Throws<InvalidOperationException>(() => big[0].GetValue<long>(), "beyond long");
            Assert.Equal(9223372036854775808m, big[0].GetValue<decimal>());
            Assert.Throws<InvalidOperationException>(() => big[1].GetValue<decimal>(), "beyond decimal");
            Assert.Equal(1.2345678901234568e32, big[1].GetValue<double>());
        }

        [Test]
        static void Fractions()
        {
            Assert.Equal(-0.0015, JsonNode.Parse("-1.5e-3").GetValue<double>());
            Assert.Equal(100.0, JsonNode.Parse("1E+2").GetValue<double>());
            Assert.Equal(0.25m, JsonNode.Parse("2.5e-1").GetValue<decimal>());
            Assert.Equal("-1.5e-3", JsonNode.Parse("-1.5e-3").ToJsonString(), "parsed numbers keep their text");
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("1.5").GetValue<int>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("1e2").GetValue<long>(), "an exponent is no integer");
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("1e400").GetValue<double>(), "beyond double");
        }

        [Test]
        static void CreatedNumbersRoundTrip()
        {
            foreach (var d in new[] { 0.1, 1.0 / 3, 123.456, -1e-7, 5e-324, double.MaxValue, 1e21 })
            {
                JsonNode node = d;
                Assert.Equal(d, JsonNode.Parse(node.ToJsonString()).GetValue<double>(), node.ToJsonString());
            }
            Assert.Equal("1", JsonValue.Create(1.0).ToJsonString());
            Assert.Equal("0.1", JsonValue.Create(0.1).ToJsonString());
            Assert.Equal("1.50", JsonValue.Create(1.50m).ToJsonString());
            Assert.Equal("-7", JsonValue.Create(-7).ToJsonString());
            Assert.Equal("9223372036854775807", JsonValue.Create(long.MaxValue).ToJsonString());
            Assert.Equal(1.5m, JsonValue.Create(1.50m).GetValue<decimal>());
            Assert.Throws<ArgumentException>(() => JsonValue.Create(double.NaN));
            Assert.Throws<ArgumentException>(() => JsonValue.Create(double.PositiveInfinity));
        }

        [Test]
        static void GetValueMismatches()
        {
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("\"1\"").GetValue<int>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("1").GetValue<string>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("true").GetValue<int>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("1").GetValue<bool>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("{}").GetValue<string>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("[]").GetValue<int>());
            Assert.Throws<InvalidOperationException>(() => JsonNode.Parse("1").GetValue<Guid>(), "unsupported type");
        }

        [Test]
        static void TryGetValueAndObject()
        {
            int i;
            Assert.True(JsonValue.Create(5).TryGetValue(out i) && i == 5, "int");
            string s;
            Assert.False(JsonValue.Create(5).TryGetValue(out s), "a number is no string");
            Assert.Null(s);
            int? n;
            Assert.True(JsonValue.Create(7).TryGetValue(out n) && n == 7, "nullable int");
            Assert.Equal((object)3L, JsonNode.Parse("3").GetValue<object>());
            Assert.Equal((object)2.5, JsonNode.Parse("2.5").GetValue<object>());
            Assert.Equal((object)"x", JsonNode.Parse("\"x\"").GetValue<object>());
            Assert.Equal((object)true, JsonNode.Parse("true").GetValue<object>());
        }

        [Test]
        static void Objects()
        {
            var o = new JsonObject { ["b"] = 1, ["a"] = "x" };
            o["c"] = null;
            o["b"] = 2; // replaced in place
            Assert.Equal("{\"b\":2,\"a\":\"x\",\"c\":null}", o.ToJsonString());
            Assert.Equal(3, o.Count);
            Assert.Null(o["missing"]);
            Assert.True(o.ContainsKey("c"), "a null member exists");
            Assert.False(o.ContainsKey("B"), "names are case-sensitive");
            JsonNode value;
            Assert.True(o.TryGetPropertyValue("a", out value) && value.GetValue<string>() == "x", "TryGetPropertyValue");
            Assert.False(o.TryGetPropertyValue("zz", out value), "TryGetPropertyValue missing");
            Assert.Throws<ArgumentException>(() => o.Add("a", 3), "Add of an existing name");
            Assert.True(o.Remove("b"), "Remove");
            Assert.False(o.Remove("b"), "Remove twice");
            o.Add("b", true);
            Assert.Equal("{\"a\":\"x\",\"c\":null,\"b\":true}", o.ToJsonString());
            Assert.SequenceEqual(new[] { "a", "c", "b" }, o.Select(kv => kv.Key));
            var added = new JsonObject { { "n", 1 }, { "s", "t" }, { "l", 5L }, { "d", 0.5 }, { "m", 2.5m }, { "z", (string)null } };
            Assert.Equal("{\"n\":1,\"s\":\"t\",\"l\":5,\"d\":0.5,\"m\":2.5,\"z\":null}", added.ToJsonString());
            Assert.Equal("{}", new JsonObject().ToJsonString());
        }

        [Test]
        static void DuplicateNamesLastWins()
        {
            var o = JsonNode.Parse("{\"a\":1,\"b\":2,\"a\":3}");
            Assert.Equal("{\"a\":3,\"b\":2}", o.ToJsonString());
        }

        [Test]
        static void Arrays()
        {
            var a = new JsonArray(1, "two", null, new JsonObject { ["x"] = false });
            Assert.Equal(4, a.Count);
            Assert.Equal("[1,\"two\",null,{\"x\":false}]", a.ToJsonString());
            a.Add(new JsonArray());
            a.Insert(0, 0);
            a.RemoveAt(1);
            a[0] = "zero";
            Assert.Equal("[\"zero\",\"two\",null,{\"x\":false},[]]", a.ToJsonString());
            var item = a[3];
            Assert.Equal(3, a.IndexOf(item));
            Assert.True(a.Contains(item), "Contains");
            Assert.True(a.Remove(item), "Remove");
            Assert.Equal(-1, a.IndexOf(item));
            IList<JsonNode> list = a;
            Assert.False(list.IsReadOnly, "IsReadOnly");
            var copy = new JsonNode[4];
            a.CopyTo(copy, 0);
            Assert.Equal("two", copy[1].GetValue<string>());
            Assert.Equal(4, a.Count(x => true));
            a.Clear();
            Assert.Equal("[]", a.ToJsonString());
            var initialized = new JsonArray { 1, "b" };
            Assert.Equal("[1,\"b\"]", initialized.ToJsonString());
            Assert.Throws<ArgumentOutOfRangeException>(() => { var x = initialized[5]; });
        }

        [Test]
        static void WrongKindAccess()
        {
            var a = JsonNode.Parse("[1]");
            var o = JsonNode.Parse("{\"a\":1}");
            Assert.Throws<InvalidOperationException>(() => a.AsObject());
            Assert.Throws<InvalidOperationException>(() => o.AsArray());
            Assert.Throws<InvalidOperationException>(() => o.AsValue());
            Assert.Throws<InvalidOperationException>(() => a["x"].ToString());
            Assert.Throws<InvalidOperationException>(() => o[0].ToString());
            Assert.Throws<InvalidOperationException>(() => o["a"]["b"].ToString());
            Assert.Equal(1, o.AsObject().Count);
            Assert.Equal(1, a.AsArray().Count);
            Assert.Equal(1, o["a"].AsValue().GetValue<int>());
        }

        [Test]
        static void Nesting()
        {
            var doc = JsonNode.Parse("{\"a\":[{\"b\":[[],{}]},{\"c\":{\"d\":[1,[2,[3]]]}}]}");
            Assert.Equal(3, doc["a"][1]["c"]["d"][1][1][0].GetValue<int>());
            Assert.Equal("{\"a\":[{\"b\":[[],{}]},{\"c\":{\"d\":[1,[2,[3]]]}}]}", doc.ToJsonString());
        }

        [Test]
        static void DepthLimit()
        {
            string ok = new string('[', 256) + new string(']', 256);
            Assert.Equal(ok, JsonNode.Parse(ok).ToJsonString());
            string deep = new string('[', 257) + new string(']', 257);
            var e = Assert.Throws<JsonException>(() => JsonNode.Parse(deep));
            Assert.True(e.Message.Contains("depth"), e.Message);
            string deepObjects = string.Concat(Enumerable.Repeat("{\"a\":", 300)) + "1" + new string('}', 300);
            Assert.Throws<JsonException>(() => JsonNode.Parse(deepObjects));
            var cycle = new JsonArray();
            cycle.Add(cycle);
            Assert.Throws<JsonException>(() => cycle.ToJsonString(), "a cycle cannot be written");
            Assert.Throws<JsonException>(() => cycle.DeepClone(), "a cycle cannot be copied");
        }

        [Test]
        static void Errors()
        {
            var cases = new Dictionary<string, int>
            {
                { "", 0 }, { "   ", 3 }, { "[1,]", 3 }, { "{\"a\":1,}", 7 }, { "{a:1}", 1 }, { "01", 1 }, { "1.", 2 },
                { "-", 1 }, { ".5", 0 }, { "1e", 2 }, { "1e+", 3 }, { "tru", 3 }, { "nul", 3 }, { "trUe", 2 }, { "\"abc", 4 },
                { "\"a\nb\"", 2 }, { "\"\\x\"", 2 }, { "\"\\u12G4\"", 5 }, { "\"\\u12", 5 }, { "[1 2]", 3 }, { "{\"a\" 1}", 5 },
                { "1 2", 2 }, { "NaN", 0 }, { "'a'", 0 }, { "[", 1 }, { "{", 1 }, { "{\"a\":", 5 }, { "[1,2", 4 }, { "+1", 0 },
                { "{\"a\":1}}", 7 }, { "\u00a0 1", 0 },
            };
            foreach (var c in cases)
            {
                var e = Assert.Throws<JsonException>(() => JsonNode.Parse(c.Key), "input " + c.Key);
                Assert.Equal(c.Value, e.Position, "position for " + c.Key + " (" + e.Message + ")");
                Assert.True(e.Message.EndsWith(" at position " + c.Value), e.Message);
            }
            Assert.Equal("unexpected character ']' at position 3", Assert.Throws<JsonException>(() => JsonNode.Parse("[1,]")).Message);
            Assert.Equal("unexpected end of JSON input at position 0", Assert.Throws<JsonException>(() => JsonNode.Parse("")).Message);
            Assert.Throws<ArgumentNullException>(() => JsonNode.Parse(null));
        }

        [Test]
        static void DeepCloneIsIndependent()
        {
            var original = JsonNode.Parse("{\"a\":[1,{\"b\":\"c\"}],\"n\":null}");
            var copy = original.DeepClone();
            copy["a"][1]["b"] = "changed";
            copy["a"].AsArray().Add(3);
            Assert.Equal("{\"a\":[1,{\"b\":\"c\"}],\"n\":null}", original.ToJsonString());
            Assert.Equal("{\"a\":[1,{\"b\":\"changed\"},3],\"n\":null}", copy.ToJsonString());
        }

        [Test]
        static void DeepEquals()
        {
            Assert.True(JsonNode.DeepEquals(JsonNode.Parse("{\"a\":1,\"b\":[true,null]}"), JsonNode.Parse("{\"b\":[true,null],\"a\":1.0}")), "order and number form do not matter");
            Assert.False(JsonNode.DeepEquals(JsonNode.Parse("[1,2]"), JsonNode.Parse("[2,1]")), "array order matters");
            Assert.False(JsonNode.DeepEquals(JsonNode.Parse("\"1\""), JsonNode.Parse("1")), "string vs number");
            Assert.False(JsonNode.DeepEquals(JsonNode.Parse("{\"a\":null}"), JsonNode.Parse("{}")), "null member vs none");
            Assert.True(JsonNode.DeepEquals(null, null), "null");
            Assert.False(JsonNode.DeepEquals(null, JsonValue.Create(false)), "null vs false");
        }

        [Test]
        static void ToStringForms()
        {
            Assert.Equal("plain \"text\"", JsonValue.Create("plain \"text\"").ToString());
            Assert.Equal("1.5", JsonValue.Create(1.5).ToString());
            Assert.Equal("true", JsonValue.Create(true).ToString());
            Assert.Equal("{\"a\":\"b\"}", new JsonObject { ["a"] = "b" }.ToString());
            Assert.Equal("[\"b\"]", new JsonArray("b").ToString());
        }

        [Test]
        static void Conversions()
        {
            JsonNode s = "x", b = true, i = 3, l = 4L, d = 0.5, m = 1.25m, none = (string)null;
            Assert.Null(none, "a null string is JSON null");
            Assert.Null(JsonValue.Create((string)null), "Create(null)");
            Assert.Equal("[\"x\",true,3,4,0.5,1.25]", new JsonArray(s, b, i, l, d, m).ToJsonString());
            Assert.Equal("x", (string)s);
            Assert.Equal(true, (bool)b);
            Assert.Equal(3, (int)i);
            Assert.Equal(4L, (long)l);
            Assert.Equal(0.5, (double)d);
            Assert.Equal(1.25m, (decimal)m);
            Assert.Null((string)none);
            Assert.Throws<InvalidOperationException>(() => ((int)none).ToString());
        }
    }
}
