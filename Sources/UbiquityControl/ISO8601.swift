/// A small ISO 8601 reader for date literals, independent of locale and time zone
/// databases: `2026-01-02`, `2026-01-02T03:04`, `2026-01-02T03:04:05`,
/// `2026-01-02T03:04:05.250`, each optionally followed by `Z` or an offset
/// (`+02:00`, `-0530`, `+02`). Without an offset the time is UTC; a date alone
/// is midnight UTC. `T` may also be a space.
enum ISO8601 {
    /// Seconds since 1970-01-01T00:00:00Z, or nil if the text is not such a date.
    static func parse(_ text: String) -> Double? {
        var s = text.utf8[...]

        func digits(_ count: Int) -> Int? {
            guard s.count >= count else { return nil }
            var value = 0
            for byte in s.prefix(count) {
                guard byte >= 0x30, byte <= 0x39 else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            s = s.dropFirst(count)
            return value
        }
        func take(_ byte: UInt8) -> Bool {
            guard s.first == byte else { return false }
            s = s.dropFirst()
            return true
        }

        guard let year = digits(4), take(0x2D), let month = digits(2), take(0x2D), let day = digits(2) else { return nil }
        guard (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day) else { return nil }
        var seconds = Double(daysFromCivil(year: year, month: month, day: day)) * 86_400
        if s.isEmpty { return seconds }

        guard take(0x54) || take(0x74) || take(0x20) else { return nil }  // T, t, space
        guard let hour = digits(2), take(0x3A), let minute = digits(2) else { return nil }
        var second = 0.0
        if take(0x3A) {
            guard let whole = digits(2) else { return nil }
            second = Double(whole)
            if take(0x2E) || take(0x2C) {  // fraction
                var scale = 0.1
                var any = false
                while let byte = s.first, byte >= 0x30, byte <= 0x39 {
                    second += Double(byte - 0x30) * scale
                    scale /= 10
                    any = true
                    s = s.dropFirst()
                }
                guard any else { return nil }
            }
        }
        guard hour <= 24, minute <= 59, second < 61, hour < 24 || (minute == 0 && second == 0) else { return nil }
        seconds += Double(hour * 3600 + minute * 60) + second

        if s.isEmpty || take(0x5A) || take(0x7A) {  // Z, z
            return s.isEmpty ? seconds : nil
        }
        let sign: Double
        if take(0x2B) { sign = 1 } else if take(0x2D) { sign = -1 } else { return nil }
        guard let offsetHours = digits(2), offsetHours <= 23 else { return nil }
        var offsetMinutes = 0
        if !s.isEmpty {
            _ = take(0x3A)
            guard let m = digits(2), m <= 59 else { return nil }
            offsetMinutes = m
        }
        guard s.isEmpty else { return nil }
        return seconds - sign * Double(offsetHours * 3600 + offsetMinutes * 60)
    }

    static func isLeap(_ year: Int) -> Bool {
        (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
    }

    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's algorithm).
    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }
}
