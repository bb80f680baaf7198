using System;
using System.Globalization;
using System.Text;

namespace Virtufin.Worker.Json
{
    /// <summary>
    /// A JSON string, boolean or number. Numbers keep their JSON text, so parsed
    /// numbers (also integers beyond 64 bits) are written back as they came;
    /// <see cref="JsonNode.GetValue{T}"/> converts on reading.
    /// </summary>
    public sealed class JsonValue : JsonNode
    {
        enum Kind { String, Bool, Number }

        readonly Kind kind;
        readonly string text; // the string, or the number's JSON text
        readonly bool flag;

        JsonValue(Kind kind, string text, bool flag)
        {
            this.kind = kind;
            this.text = text;
            this.flag = flag;
        }

        internal static JsonValue Number(string jsonText) { return new JsonValue(Kind.Number, jsonText, false); }

        /// <summary>A string value; null for a null string.</summary>
        public static JsonValue Create(string value) { return value == null ? null : new JsonValue(Kind.String, value, false); }
        /// <summary>A boolean value.</summary>
        public static JsonValue Create(bool value) { return new JsonValue(Kind.Bool, null, value); }
        /// <summary>A number value.</summary>
        public static JsonValue Create(int value) { return Number(value.ToString(CultureInfo.InvariantCulture)); }
        /// <summary>A number value.</summary>
        public static JsonValue Create(long value) { return Number(value.ToString(CultureInfo.InvariantCulture)); }
        /// <summary>A number value; throws <see cref="ArgumentException"/> for NaN and infinities (not JSON).</summary>
        public static JsonValue Create(double value)
        {
            if (double.IsNaN(value) || double.IsInfinity(value))
                throw new ArgumentException("JSON has no number " + value.ToString(CultureInfo.InvariantCulture), "value");
            return Number(value.ToString("R", CultureInfo.InvariantCulture));
        }
        /// <summary>A number value.</summary>
        public static JsonValue Create(decimal value) { return Number(value.ToString(CultureInfo.InvariantCulture)); }

        /// <summary>
        /// Reads the value as T (string, bool, int, long, double, decimal, their
        /// nullable forms, or object: the string, bool, long or double);
        /// false when it is another kind of value or does not fit T.
        /// </summary>
        public bool TryGetValue<T>(out T value)
        {
            object o;
            var type = Nullable.GetUnderlyingType(typeof(T)) ?? typeof(T);
            if (TryConvert(type, out o))
            {
                value = (T)o;
                return true;
            }
            value = default(T);
            return false;
        }

        bool TryConvert(Type type, out object result)
        {
            result = null;
            if (type == typeof(object))
            {
                if (kind == Kind.String) result = text;
                else if (kind == Kind.Bool) result = flag;
                else
                {
                    long l;
                    double d;
                    if (TryLong(out l)) result = l;
                    else if (TryDouble(out d)) result = d;
                    else result = text;
                }
                return true;
            }
            if (kind == Kind.String)
            {
                if (type != typeof(string)) return false;
                result = text;
                return true;
            }
            if (kind == Kind.Bool)
            {
                if (type != typeof(bool)) return false;
                result = flag;
                return true;
            }
            if (type == typeof(long))
            {
                long l;
                if (!TryLong(out l)) return false;
                result = l;
                return true;
            }
            if (type == typeof(int))
            {
                long l;
                if (!TryLong(out l) || l < int.MinValue || l > int.MaxValue) return false;
                result = (int)l;
                return true;
            }
            if (type == typeof(double))
            {
                double d;
                if (!TryDouble(out d)) return false;
                result = d;
                return true;
            }
            if (type == typeof(decimal))
            {
                decimal m;
                if (!TryDecimal(out m)) return false;
                result = m;
                return true;
            }
            return false;
        }

        bool IsInteger { get { return text.IndexOfAny(NonInteger) < 0; } }

        static readonly char[] NonInteger = { '.', 'e', 'E' };

        bool TryLong(out long l)
        {
            l = 0;
            return IsInteger && long.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out l);
        }

        bool TryDouble(out double d)
        {
            try
            {
                d = double.Parse(text, NumberStyles.Float, CultureInfo.InvariantCulture);
                return !double.IsInfinity(d);
            }
            catch (OverflowException) // .NET Framework and Mono for values beyond double
            {
                d = 0;
                return false;
            }
        }

        bool TryDecimal(out decimal m)
        {
            return decimal.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out m);
        }

        internal override void WriteTo(StringBuilder sb, int depth)
        {
            if (kind == Kind.String) WriteString(sb, text);
            else if (kind == Kind.Bool) sb.Append(flag ? "true" : "false");
            else sb.Append(text);
        }

        internal override JsonNode CloneAt(int depth)
        {
            return new JsonValue(kind, text, flag);
        }

        internal override bool EqualsAt(JsonNode other, int depth)
        {
            var v = other as JsonValue;
            if (v == null || v.kind != kind) return false;
            if (kind == Kind.Bool) return flag == v.flag;
            if (text == v.text) return true;
            if (kind == Kind.String) return false;
            decimal a, b;
            if (TryDecimal(out a) && v.TryDecimal(out b)) return a == b;
            double x, y;
            return TryDouble(out x) && v.TryDouble(out y) && x == y;
        }

        /// <summary>A string's text (unquoted); the JSON text of other values.</summary>
        public override string ToString()
        {
            return kind == Kind.String ? text : ToJsonString();
        }
    }
}
