using System;
using System.Linq;
using Virtufin.Worker.Json;

namespace Virtufin.Worker.Tests
{
    static class CloudEventTests
    {
        const string Full = "{\"specversion\":\"1.0\",\"id\":\"e1\",\"source\":\"urn:src\",\"type\":\"orders.created\"," +
            "\"datacontenttype\":\"application/json\",\"dataschema\":\"urn:schema\",\"subject\":\"order\"," +
            "\"time\":\"2024-05-06T07:08:09.123Z\",\"correlationid\":\"c-1\",\"count\":42,\"flag\":true," +
            "\"data\":{\"id\":7,\"items\":[1,2]}}";

        [Test]
        static void ParsesAttributes()
        {
            var e = CloudEvent.Parse(Full);
            Assert.Equal("1.0", e.SpecVersion);
            Assert.Equal("e1", e.Id);
            Assert.Equal("urn:src", e.Source);
            Assert.Equal("orders.created", e.Type);
            Assert.Equal("application/json", e.DataContentType);
            Assert.Equal("urn:schema", e.DataSchema);
            Assert.Equal("order", e.Subject);
            Assert.Equal("2024-05-06T07:08:09.123Z", e.Time);
            Assert.Json("{\"id\":7,\"items\":[1,2]}", e.Data);
            Assert.Null(e.DataBase64);
            Assert.Equal(7, e.Data["id"].GetValue<int>());
        }

        [Test]
        static void ParsesExtensionsByType()
        {
            var e = CloudEvent.Parse("{\"specversion\":\"1.0\",\"id\":\"e\",\"source\":\"s\",\"type\":\"t\"," +
                "\"str\":\"v\",\"int\":-5,\"big\":12345678901234567890,\"yes\":true,\"no\":false,\"frac\":1.5,\"exp\":1e3," +
                "\"obj\":{\"a\":[1]},\"arr\":[\"x\"],\"nothing\":null}");
            Assert.Equal((object)"v", e["str"]);
            Assert.Equal((object)(-5L), e["int"], "an integer is a long");
            Assert.Equal((object)"12345678901234567890", e["big"], "an integer beyond long is its JSON text");
            Assert.Equal((object)true, e["yes"]);
            Assert.Equal((object)false, e["no"]);
            Assert.Equal((object)"1.5", e["frac"], "a fraction is its JSON text");
            Assert.Equal((object)"1e3", e["exp"]);
            Assert.Equal((object)"{\"a\":[1]}", e["obj"]);
            Assert.Equal((object)"[\"x\"]", e["arr"]);
            Assert.False(e.Extensions.ContainsKey("nothing"), "null members are left out");
            Assert.Equal(9, e.Extensions.Count);
            Assert.Null(e["absent"]);
        }

        [Test]
        static void ParsesTextAndBinaryData()
        {
            var text = CloudEvent.Parse("{\"type\":\"t\",\"datacontenttype\":\"text/plain\",\"data\":\"hello {not json\"}");
            Assert.Equal("hello {not json", text.Data.GetValue<string>());
            Assert.Equal("\"hello {not json\"", text.Data.ToJsonString());
            var binary = CloudEvent.Parse("{\"type\":\"t\",\"datacontenttype\":\"application/octet-stream\",\"data_base64\":\"AAEC/w==\"}");
            Assert.SequenceEqual(new byte[] { 0, 1, 2, 255 }, binary.DataBase64);
            Assert.Null(binary.Data);
            var none = CloudEvent.Parse("{\"type\":\"t\",\"data\":null}");
            Assert.Null(none.Data);
            Assert.Equal("1.0", none.SpecVersion, "no specversion member: the default");
        }

        [Test]
        static void ParseErrors()
        {
            foreach (var input in new[] { "[]", "\"x\"", "null", "1", "true" })
            {
                var e = Assert.Throws<FormatException>(() => CloudEvent.Parse(input), input);
                Assert.True(e.Message.StartsWith("a CloudEvent in JSON must be an object, not "), e.Message);
            }
            var bad = Assert.Throws<FormatException>(() => CloudEvent.Parse("{\"id\":"));
            Assert.True(bad.InnerException is JsonException, "invalid JSON: inner JsonException");
            Assert.True(bad.Message.Contains("position 6"), bad.Message);
            var id = Assert.Throws<FormatException>(() => CloudEvent.Parse("{\"id\":5}"));
            Assert.Equal("CloudEvent attribute \"id\" must be a string, not a number", id.Message);
            Assert.Throws<FormatException>(() => CloudEvent.Parse("{\"type\":[\"t\"]}"));
            var both = Assert.Throws<FormatException>(() => CloudEvent.Parse("{\"data\":1,\"data_base64\":\"AA==\"}"));
            Assert.True(both.Message.Contains("both"), both.Message);
            var b64 = Assert.Throws<FormatException>(() => CloudEvent.Parse("{\"data_base64\":\"***\"}"));
            Assert.True(b64.Message.StartsWith("CloudEvent attribute \"data_base64\" is not base64"), b64.Message);
            Assert.Throws<ArgumentNullException>(() => CloudEvent.Parse(null));
        }

        [Test]
        static void ToJsonOmitsNulls()
        {
            var e = new CloudEvent { Type = "t" };
            Assert.Equal("{\"specversion\":\"1.0\",\"type\":\"t\"}", e.ToJson());
            e.SpecVersion = null;
            Assert.Equal("{\"type\":\"t\"}", e.ToJson());
        }

        [Test]
        static void ToJsonWritesEverything()
        {
            var e = new CloudEvent
            {
                Id = "i", Source = "s", Type = "t", DataContentType = "application/json", DataSchema = "urn:d",
                Subject = "sub", Time = "2024-01-01T00:00:00Z", Data = new JsonObject { ["k"] = "v" },
            };
            e["str"] = "x";
            e["lng"] = 1L << 40;
            e["int"] = 7;
            e["flag"] = false;
            Assert.Equal("{\"specversion\":\"1.0\",\"id\":\"i\",\"source\":\"s\",\"type\":\"t\",\"datacontenttype\":\"application/json\"," +
                "\"dataschema\":\"urn:d\",\"subject\":\"sub\",\"time\":\"2024-01-01T00:00:00Z\",\"str\":\"x\",\"lng\":1099511627776," +
                "\"int\":7,\"flag\":false,\"data\":{\"k\":\"v\"}}", e.ToJson());
            var back = CloudEvent.Parse(e.ToJson());
            Assert.Equal((object)(1L << 40), back["lng"]);
            Assert.Equal((object)7L, back["int"], "an int comes back as a long");
            Assert.Equal((object)false, back["flag"]);
            Assert.Equal((object)"x", back["str"]);
            Assert.Equal(e.ToJson(), back.ToJson());
        }

        [Test]
        static void RoundTrips()
        {
            foreach (var json in new[]
            {
                Full,
                "{\"specversion\":\"1.0\",\"id\":\"b\",\"source\":\"s\",\"type\":\"t\",\"datacontenttype\":\"application/octet-stream\",\"data_base64\":\"AAEC/w==\"}",
                "{\"specversion\":\"1.0\",\"id\":\"x\",\"source\":\"s\",\"type\":\"t\",\"datacontenttype\":\"text/plain\",\"data\":\"line\\nnext \\u0001 é\"}",
                "{\"specversion\":\"1.0\",\"id\":\"n\",\"source\":\"s\",\"type\":\"t\",\"data\":[1,2.5,-3e-7,null,true,123456789012345678901234567890]}",
                "{\"specversion\":\"1.0\",\"id\":\"s\",\"source\":\"s\",\"type\":\"t\",\"data\":\"\"}",
            })
            {
                Assert.Equal(json, CloudEvent.Parse(json).ToJson(), "Parse then ToJson");
            }
        }

        [Test]
        static void BinaryData()
        {
            var e = new CloudEvent { Type = "t", DataBase64 = new byte[] { 1, 2, 3 } };
            Assert.Equal("{\"specversion\":\"1.0\",\"type\":\"t\",\"data_base64\":\"AQID\"}", e.ToJson());
            var empty = new CloudEvent { Type = "t", DataBase64 = new byte[0] };
            Assert.Equal("{\"specversion\":\"1.0\",\"type\":\"t\",\"data_base64\":\"\"}", empty.ToJson());
            Assert.SequenceEqual(new byte[0], CloudEvent.Parse(empty.ToJson()).DataBase64);
        }

        [Test]
        static void DataAndBinaryDataAreExclusive()
        {
            var e = new CloudEvent { Data = 1 };
            e.DataBase64 = new byte[] { 9 };
            Assert.Null(e.Data, "setting DataBase64 clears Data");
            e.Data = "text";
            Assert.Null(e.DataBase64, "setting Data clears DataBase64");
            e.Data = null;
            Assert.Null(e.Data);
            Assert.Null(e.DataBase64);
        }

        [Test]
        static void ExtensionIndexer()
        {
            var e = new CloudEvent();
            Assert.NotNull(e.Extensions, "Extensions is never null");
            Assert.Null(e["tenant"]);
            e["tenant"] = "acme";
            Assert.Equal((object)"acme", e["tenant"]);
            Assert.Equal((object)"acme", e.Extensions["tenant"]);
            e["tenant"] = null;
            Assert.False(e.Extensions.ContainsKey("tenant"), "setting null removes");
            e["tenant"] = null; // removing an absent one is fine
            Assert.Throws<ArgumentException>(() => e["Tenant"] = "x", "upper case");
            Assert.Throws<ArgumentException>(() => e["ten-ant"] = "x", "dash");
            Assert.Throws<ArgumentException>(() => e[""] = "x", "empty");
            Assert.Throws<ArgumentException>(() => e["id"] = "x", "an attribute name");
            Assert.Throws<ArgumentException>(() => e["data"] = "x", "data");
            Assert.Throws<ArgumentException>(() => e["ratio"] = 1.5, "a double value");
            Assert.Throws<ArgumentException>(() => e["when"] = DateTime.UtcNow, "a DateTime value");
            e["n1"] = 1;
            e["n2"] = 2L;
            e["b"] = true;
            Assert.Equal(3, e.Extensions.Count);
        }

        [Test]
        static void ToJsonChecksExtensions()
        {
            var e = new CloudEvent { Type = "t" };
            e.Extensions["Bad"] = "x";
            var error = Assert.Throws<InvalidOperationException>(() => e.ToJson());
            Assert.True(error.Message.Contains("lower-case letters and digits"), error.Message);
            e.Extensions.Remove("Bad");
            e.Extensions["ratio"] = 0.5;
            Assert.Throws<InvalidOperationException>(() => e.ToJson());
            e.Extensions.Remove("ratio");
            e.Extensions["type"] = "shadow";
            Assert.Throws<InvalidOperationException>(() => e.ToJson());
            e.Extensions.Remove("type");
            e.Extensions["gone"] = null;
            Assert.Equal("{\"specversion\":\"1.0\",\"type\":\"t\"}", e.ToJson(), "a null value is left out");
        }

        [Test]
        static void CloneIsDeep()
        {
            var e = CloudEvent.Parse(Full);
            var c = e.Clone();
            Assert.Equal(e.ToJson(), c.ToJson());
            c.Data["id"] = 8;
            c["correlationid"] = "other";
            c.Subject = "changed";
            Assert.Equal(7, e.Data["id"].GetValue<int>());
            Assert.Equal((object)"c-1", e["correlationid"]);
            Assert.Equal("order", e.Subject);
            var b = new CloudEvent { DataBase64 = new byte[] { 1 } };
            var bc = b.Clone();
            bc.DataBase64[0] = 2;
            Assert.Equal((byte)1, b.DataBase64[0]);
        }

        [Test]
        static void WithCorrelationIdPresent()
        {
            var input = new CloudEvent { Id = "in" };
            input["correlationid"] = "corr-9";
            var output = new CloudEvent { Type = "out" };
            Assert.True(ReferenceEquals(output, output.WithCorrelationId(input)), "returns output");
            Assert.Equal((object)"corr-9", output["correlationid"]);
            var replaced = new CloudEvent { Type = "out" };
            replaced["correlationid"] = "old";
            replaced.WithCorrelationId(input);
            Assert.Equal((object)"corr-9", replaced["correlationid"]);
        }

        [Test]
        static void WithCorrelationIdAbsent()
        {
            var input = new CloudEvent { Id = "in" };
            var output = new CloudEvent { Type = "out" };
            Assert.True(ReferenceEquals(output, output.WithCorrelationId(input)), "returns output");
            Assert.False(output.Extensions.ContainsKey("correlationid"), "nothing added");
            var kept = new CloudEvent { Type = "out" };
            kept["correlationid"] = "own";
            kept.WithCorrelationId(input);
            Assert.Equal((object)"own", kept["correlationid"], "no-op when the input has none");
            Assert.Equal(0, output.Extensions.Count(kv => true));
        }

        [Test]
        static void DevKitVersion()
        {
            Assert.Equal("0.2.0", DevKitInfo.Version);
        }
    }
}
